//! scheduler (being written: GPU scheduling policies)
