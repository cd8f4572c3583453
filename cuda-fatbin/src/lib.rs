//! CUDA fat binaries as nvcc 13 emits them: the `.nvFatBinSegment` wrapper, the fat binary's
//! entries (PTX or SASS), PTX decompression (LZ4, ZSTD), and the choice of the PTX a backend
//! can run. Every input is hostile: parsing is bounded and never panics.
