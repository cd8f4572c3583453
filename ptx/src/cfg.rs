//! Control-flow analysis.
