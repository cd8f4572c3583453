//! shadow (being written: shadow page tables and channels)
