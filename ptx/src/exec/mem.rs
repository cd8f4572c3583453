//! Memory access paths.
