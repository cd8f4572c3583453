//! mmio (placeholder: filled in by its first real code)
