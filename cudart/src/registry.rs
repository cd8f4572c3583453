//! What a program registers at start-up, before any driver call: its fat binaries
//! (`__cudaRegisterFatBinary`), each one's kernels (host stub address -> device name) and
//! variables (host shadow address -> device name, size, constant). Lookups by host address
//! drive lazy module loading. Pure bookkeeping: addresses are kept as numbers, never read.

use std::collections::HashMap;
use std::ffi::CString;

/// A registered kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub fatbin: usize,
    pub name: CString,
}

/// A registered `__device__` / `__constant__` / `__managed__` variable.
#[derive(Clone, Debug, PartialEq)]
pub struct Var {
    pub fatbin: usize,
    pub name: CString,
    pub size: usize,
    pub constant: bool,
    /// For a managed variable: where the program keeps its pointer to it (`__cudaInitModule`
    /// stores the variable's address there).
    pub managed_slot: Option<usize>,
}

/// A registered fat binary.
#[derive(Clone, Debug, PartialEq)]
pub struct FatBinary {
    /// Address of the fat binary (header magic 0xBA55ED50); 0 if what was registered was not one.
    pub image: usize,
    pub live: bool,
}

/// The process's registrations.
#[derive(Default, Debug)]
pub struct Registry {
    fatbins: Vec<FatBinary>,
    functions: HashMap<usize, Function>,
    vars: HashMap<usize, Var>,
}

impl Registry {
    /// Records a fat binary; returns its index.
    pub fn add_fatbin(&mut self, image: usize) -> usize {
        self.fatbins.push(FatBinary { image, live: true });
        self.fatbins.len() - 1
    }

    pub fn fatbin(&self, idx: usize) -> Option<&FatBinary> {
        self.fatbins.get(idx).filter(|f| f.live)
    }

    /// Indices of the live fat binaries that registered a kernel (what eager loading loads).
    pub fn fatbins_with_kernels(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .functions
            .values()
            .map(|f| f.fatbin)
            .filter(|&i| self.fatbin(i).is_some())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Records a kernel of a live fat binary; `false` if `fatbin` is unknown.
    pub fn add_function(&mut self, fatbin: usize, host: usize, name: CString) -> bool {
        if self.fatbin(fatbin).is_none() {
            return false;
        }
        self.functions.insert(host, Function { fatbin, name });
        true
    }

    /// Records a variable of a live fat binary; `false` if `fatbin` is unknown.
    pub fn add_var(&mut self, host: usize, var: Var) -> bool {
        if self.fatbin(var.fatbin).is_none() {
            return false;
        }
        self.vars.insert(host, var);
        true
    }

    pub fn function(&self, host: usize) -> Option<&Function> {
        self.functions.get(&host)
    }

    pub fn var(&self, host: usize) -> Option<&Var> {
        self.vars.get(&host)
    }

    /// The managed variables of a fat binary.
    pub fn managed_vars(&self, fatbin: usize) -> Vec<Var> {
        self.vars
            .values()
            .filter(|v| v.fatbin == fatbin && v.managed_slot.is_some())
            .cloned()
            .collect()
    }

    /// Forgets a fat binary and everything registered with it.
    pub fn remove_fatbin(&mut self, idx: usize) {
        if let Some(f) = self.fatbins.get_mut(idx) {
            f.live = false;
        }
        self.functions.retain(|_, f| f.fatbin != idx);
        self.vars.retain(|_, v| v.fatbin != idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    #[test]
    fn functions_and_vars_resolve_per_fat_binary() {
        let mut r = Registry::default();
        let a = r.add_fatbin(0x1000);
        let b = r.add_fatbin(0x2000);
        assert!(r.add_function(a, 0x10, c("_Z4vaddPKfS0_Pfi")));
        assert!(r.add_function(b, 0x20, c("kern_b")));
        let var = Var {
            fatbin: a,
            name: c("scale"),
            size: 4,
            constant: true,
            managed_slot: None,
        };
        assert!(r.add_var(0x30, var.clone()));
        assert_eq!(
            r.function(0x10).map(|f| (f.fatbin, f.name.clone())),
            Some((a, c("_Z4vaddPKfS0_Pfi")))
        );
        assert_eq!(r.function(0x20).map(|f| f.fatbin), Some(b));
        assert_eq!(r.var(0x30), Some(&var));
        assert_eq!(r.function(0x30), None);
        assert_eq!(r.fatbin(b).map(|f| f.image), Some(0x2000));
    }

    #[test]
    fn unknown_fat_binaries_are_refused_and_removal_forgets() {
        let mut r = Registry::default();
        assert!(!r.add_function(3, 0x10, c("k")));
        let a = r.add_fatbin(0x1000);
        assert!(r.add_function(a, 0x10, c("k")));
        let m = Var {
            fatbin: a,
            name: c("m"),
            size: 8,
            constant: false,
            managed_slot: Some(0x99),
        };
        assert!(r.add_var(0x40, m.clone()));
        assert_eq!(r.managed_vars(a), vec![m]);
        r.remove_fatbin(a);
        assert_eq!(r.function(0x10), None);
        assert_eq!(r.var(0x40), None);
        assert!(r.fatbin(a).is_none());
        assert!(!r.add_function(a, 0x10, c("k")));
    }
}
