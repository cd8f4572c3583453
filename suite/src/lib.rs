//! suite (placeholder: filled in by its first real code)
