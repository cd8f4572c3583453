//! ptx (placeholder: filled in by its first real code)
