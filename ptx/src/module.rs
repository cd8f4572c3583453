//! A decoded PTX module: its kernels (entries), their parameter layout, memory needs and code.

use std::sync::Arc;

use crate::ir::Entry;
use crate::load::elems;
use crate::modvars::ModMem;

/// A parsed and decoded module. Immutable, `Send + Sync`; share it behind an `Arc`.
#[derive(Debug)]
pub struct Module {
    /// Decoded code, shared by the instances of the module ([`Module::instantiate`]).
    pub(crate) entries: Arc<Vec<Entry>>,
    pub(crate) hash: u64,
    /// Module-scope `.global`/`.const` variables and their storage.
    pub(crate) vars: ModMem,
}

/// Public description of one `.entry` of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// Entry (kernel) name as written in the PTX.
    pub name: String,
    /// Parameters in declaration order.
    pub params: Vec<ParamInfo>,
    /// Exact size in bytes the launch parameter buffer must have (end of the last parameter).
    pub param_size: u32,
    /// Static shared memory per CTA in bytes (module- and entry-level `.shared` variables).
    pub static_shared_bytes: u32,
    /// Alignment the dynamic (`.extern .shared`) area starts at, after static shared memory.
    pub dynamic_shared_align: u32,
    /// Local memory per thread in bytes (`.local` variables).
    pub local_bytes_per_thread: u32,
    /// `.reqntid` if present.
    pub reqntid: Option<[u32; 3]>,
    /// `.maxntid` if present.
    pub maxntid: Option<[u32; 3]>,
    /// Number of decoded instructions.
    pub instructions: usize,
}

/// One kernel parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Name as written in the PTX.
    pub name: String,
    /// Byte offset in the parameter buffer (aligned to `align`).
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// Alignment in bytes.
    pub align: u32,
}

impl Module {
    /// Content hash of the PTX text (FNV-1a 64); saved contexts are bound to it.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// All entries, in source order.
    pub fn entries(&self) -> impl Iterator<Item = &EntryInfo> {
        self.entries.iter().map(|e| &e.info)
    }

    /// The entry named `name`.
    pub fn entry(&self, name: &str) -> Option<&EntryInfo> {
        self.entry_index(name).map(|i| &self.entries[i].info)
    }

    /// True when the module declares `.global`/`.const` variables, i.e. holds mutable state
    /// shared by all its launches. Such a module must not be shared between isolation domains
    /// (VMs): give each its own instance ([`Module::instantiate`]).
    pub fn has_variables(&self) -> bool {
        !self.vars.vars.is_empty()
    }

    /// A new instance of this module: the same decoded code (shared, not copied) and hash,
    /// with its own variables reset to their PTX initial values (cheaper than parsing the text
    /// again). The copy holds [`Module::variable_bytes`] of new host memory (its
    /// [`Module::host_bytes`] counts the shared code as well).
    pub fn instantiate(&self) -> Module {
        Module {
            entries: Arc::clone(&self.entries),
            hash: self.hash,
            vars: self.vars.fresh(),
        }
    }

    /// Estimated host bytes this module holds: its decoded code and the module variables.
    ///
    /// Computed from the retained structures: per entry its struct, the decoded instructions
    /// (`code.capacity() × size_of::<Op>()` plus the operand lists of vector moves), one source
    /// position and one reconvergence point per instruction, and its name and parameter names;
    /// plus [`Module::variable_bytes`] and the `Module` struct. Strings count their length
    /// rounded up to 8 bytes plus 8 for the allocator. The decoded code is shared by
    /// [`Module::instantiate`] copies but counted in each (an instance keeps it alive).
    /// Loading never exceeds [`crate::LoadOptions::max_host_bytes`], so neither does this.
    pub fn host_bytes(&self) -> u64 {
        elems::<Module>(1)
            + elems::<Entry>(self.entries.capacity())
            + self
                .entries
                .iter()
                .map(|e| e.host_bytes() - elems::<Entry>(1))
                .sum::<u64>()
            + self.variable_bytes()
    }

    /// Host bytes of the module's own `.global`/`.const` variables: their storage, the
    /// initial image kept for [`Module::instantiate`] (each as large as the variables, rounded
    /// to 8 bytes for the storage) and the name table. What each instance adds.
    pub fn variable_bytes(&self) -> u64 {
        self.vars.host_bytes()
    }

    /// A module-scope `.global`/`.const` variable: (address in [`crate::MODULE_WINDOW`], size).
    pub fn variable(&self, name: &str) -> Option<(u64, u64)> {
        self.vars
            .var(name)
            .map(|v| (crate::memory::MODULE_WINDOW + v.offset, v.size))
    }

    /// Module-scope variables in layout order (`.const` ones first): name, offset in the
    /// module's variable storage (aligned as declared) and size. With
    /// [`Module::variables_image`], what a loader needs to place the variables in memory of its
    /// own (the CUDA driver library puts them in device memory: `cuModuleGetGlobal`).
    pub fn variable_layout(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.vars
            .vars
            .iter()
            .map(|v| (v.name.as_str(), v.offset, v.size))
    }

    /// The initial contents of the whole variable storage, indexed by
    /// [`Module::variable_layout`]'s offsets (from the PTX initializers, zero elsewhere).
    pub fn variables_image(&self) -> &[u8] {
        self.vars.initial()
    }

    /// Current contents of a module variable (host side, like `cuMemcpyDtoH` of a symbol).
    pub fn read_variable(&self, name: &str) -> Option<Vec<u8>> {
        self.vars
            .var(name)
            .map(|v| self.vars.read(v.offset, v.size))
    }

    /// Overwrite the start of a module variable (host side; `.const` ones too). Returns false
    /// for an unknown name or data longer than the variable.
    pub fn write_variable(&self, name: &str, data: &[u8]) -> bool {
        match self.vars.var(name) {
            Some(v) if data.len() as u64 <= v.size => {
                self.vars.write(v.offset, data);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn entry_index(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.info.name == name)
    }
}

/// FNV-1a 64-bit hash.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
