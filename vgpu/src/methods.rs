//! The method state of a channel (the registers methods write) and the commands that method
//! writes trigger: semaphore acquire/release, copies and kernel launches.

use crate::regs::method::*;

/// A kernel launch as the methods describe it (addresses are GPU VAs, unvalidated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchDesc {
    pub code_va: u64,
    pub code_len: u32,
    pub entry_va: u64,
    pub entry_len: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub param_va: u64,
    pub param_len: u32,
}

/// Work a method write triggers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    SemAcquire {
        va: u64,
        payload: u32,
    },
    SemRelease {
        va: u64,
        payload: u32,
        interrupt: bool,
        timestamp: bool,
    },
    Copy {
        src: u64,
        dst: u64,
        len: u64,
    },
    Launch(LaunchDesc),
}

/// A method write the device refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MethodError {
    #[error("unknown method {0:#x}")]
    Unknown(u32),
    #[error("SEM_EXECUTE {0:#x}: bad operation or reserved bits")]
    SemExecute(u32),
}

const NREGS: usize = (LAUNCH as usize >> 2) + 1;

/// The method registers of one channel. They persist across pushbuffer segments.
#[derive(Debug, Clone)]
pub struct MethodState {
    regs: [u32; NREGS],
}

impl Default for MethodState {
    fn default() -> Self {
        MethodState { regs: [0; NREGS] }
    }
}

fn known(addr: u32) -> bool {
    matches!(
        addr,
        NOP | SEM_ADDR_HI | SEM_ADDR_LO | SEM_PAYLOAD | SEM_EXECUTE
    ) || (COPY_SRC_HI..=COPY_LAUNCH).contains(&addr)
        || (CODE_HI..=LAUNCH).contains(&addr)
}

impl MethodState {
    /// How many method registers a channel has (snapshot: `words`, `from_words`).
    pub const WORDS: usize = NREGS;

    /// The register values, by method address / 4 (snapshot).
    pub fn words(&self) -> &[u32] {
        &self.regs
    }

    /// The state with these register values; `None` unless there are exactly `WORDS` of them.
    /// Any values are valid: methods are validated when they trigger a command.
    pub fn from_words(words: &[u32]) -> Option<Self> {
        Some(MethodState {
            regs: words.try_into().ok()?,
        })
    }

    fn get(&self, addr: u32) -> u32 {
        self.regs[(addr >> 2) as usize]
    }

    fn wide(&self, hi: u32, lo: u32) -> u64 {
        u64::from(self.get(hi)) << 32 | u64::from(self.get(lo))
    }

    /// Applies one method write; returns the command it triggers, if any.
    pub fn apply(&mut self, addr: u32, data: u32) -> Result<Option<Command>, MethodError> {
        if addr & 3 != 0 || !known(addr) {
            return Err(MethodError::Unknown(addr));
        }
        self.regs[(addr >> 2) as usize] = data;
        Ok(match addr {
            SEM_EXECUTE => {
                let va = self.wide(SEM_ADDR_HI, SEM_ADDR_LO);
                let payload = self.get(SEM_PAYLOAD);
                if data & !(0x3 | SEM_FLAG_INTERRUPT | SEM_FLAG_TIMESTAMP) != 0 {
                    return Err(MethodError::SemExecute(data));
                }
                match data & 0x3 {
                    SEM_OP_ACQUIRE if data & (SEM_FLAG_INTERRUPT | SEM_FLAG_TIMESTAMP) == 0 => {
                        Some(Command::SemAcquire { va, payload })
                    }
                    SEM_OP_RELEASE => Some(Command::SemRelease {
                        va,
                        payload,
                        interrupt: data & SEM_FLAG_INTERRUPT != 0,
                        timestamp: data & SEM_FLAG_TIMESTAMP != 0,
                    }),
                    _ => return Err(MethodError::SemExecute(data)),
                }
            }
            COPY_LAUNCH => Some(Command::Copy {
                src: self.wide(COPY_SRC_HI, COPY_SRC_LO),
                dst: self.wide(COPY_DST_HI, COPY_DST_LO),
                len: u64::from(self.get(COPY_LEN)),
            }),
            LAUNCH => Some(Command::Launch(LaunchDesc {
                code_va: self.wide(CODE_HI, CODE_LO),
                code_len: self.get(CODE_LEN),
                entry_va: self.wide(ENTRY_HI, ENTRY_LO),
                entry_len: self.get(ENTRY_LEN),
                grid: [self.get(GRID_X), self.get(GRID_X + 4), self.get(GRID_X + 8)],
                block: [
                    self.get(BLOCK_X),
                    self.get(BLOCK_X + 4),
                    self.get(BLOCK_X + 8),
                ],
                shared_bytes: self.get(SHARED_BYTES),
                param_va: self.wide(PARAM_HI, PARAM_LO),
                param_len: self.get(PARAM_LEN),
            })),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_build_commands() {
        let mut s = MethodState::default();
        for (a, d) in [
            (COPY_SRC_HI, 1),
            (COPY_SRC_LO, 2),
            (COPY_DST_HI, 3),
            (COPY_DST_LO, 4),
            (COPY_LEN, 4096),
        ] {
            assert_eq!(s.apply(a, d), Ok(None));
        }
        assert_eq!(
            s.apply(COPY_LAUNCH, 0),
            Ok(Some(Command::Copy {
                src: 1 << 32 | 2,
                dst: 3 << 32 | 4,
                len: 4096
            }))
        );
        s.apply(SEM_ADDR_LO, 0x1000).unwrap();
        s.apply(SEM_PAYLOAD, 9).unwrap();
        assert_eq!(
            s.apply(SEM_EXECUTE, SEM_OP_RELEASE | SEM_FLAG_INTERRUPT),
            Ok(Some(Command::SemRelease {
                va: 0x1000,
                payload: 9,
                interrupt: true,
                timestamp: false
            }))
        );
        assert_eq!(
            s.apply(SEM_EXECUTE, SEM_OP_ACQUIRE),
            Ok(Some(Command::SemAcquire {
                va: 0x1000,
                payload: 9
            }))
        );
        for (i, a) in (CODE_HI..=PARAM_LEN).step_by(4).enumerate() {
            s.apply(a, i as u32 + 1).unwrap();
        }
        let Ok(Some(Command::Launch(l))) = s.apply(LAUNCH, 0) else {
            panic!("launch")
        };
        assert_eq!(
            (l.code_va, l.code_len, l.grid, l.block, l.param_len),
            (1 << 32 | 2, 3, [7, 8, 9], [10, 11, 12], 16)
        );
    }

    #[test]
    fn bad_methods_are_refused() {
        let mut s = MethodState::default();
        assert_eq!(s.apply(0x300, 0), Err(MethodError::Unknown(0x300)));
        assert_eq!(s.apply(0x0f0, 0), Err(MethodError::Unknown(0x0f0)));
        assert_eq!(s.apply(0x102, 0), Err(MethodError::Unknown(0x102)));
        assert_eq!(
            s.apply(LAUNCH + 4, 0),
            Err(MethodError::Unknown(LAUNCH + 4))
        );
        assert_eq!(s.apply(SEM_EXECUTE, 0), Err(MethodError::SemExecute(0)));
        assert_eq!(s.apply(SEM_EXECUTE, 3), Err(MethodError::SemExecute(3)));
        assert_eq!(
            s.apply(SEM_EXECUTE, SEM_OP_RELEASE | 1 << 8),
            Err(MethodError::SemExecute(SEM_OP_RELEASE | 1 << 8))
        );
        assert_eq!(
            s.apply(SEM_EXECUTE, SEM_OP_ACQUIRE | SEM_FLAG_INTERRUPT),
            Err(MethodError::SemExecute(0x11))
        );
    }
}
