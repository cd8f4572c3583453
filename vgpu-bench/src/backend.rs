//! `--backend` of the experiments: the physical GPU behind every VM (and the native baseline).

/// The engine under every configuration (`--gpu backend=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The software GPU (`pgpu::sim`).
    Sim,
    /// A real NVIDIA GPU (`pgpu::cuda`; needs the CUDA driver).
    Cuda,
}

impl Backend {
    /// The `--gpu backend=` value.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Cuda => "cuda",
        }
    }
}
