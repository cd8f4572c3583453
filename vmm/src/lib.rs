//! vmm (placeholder: filled in by its first real code)
