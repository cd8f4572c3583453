//! C types of the runtime API's signatures: `dim3`, and `Out<T>`, a program's pointer to a `T`
//! the runtime writes (ABI-identical to `T *`), so that every write through a program's pointer
//! goes through one checked place.

use crate::error::{INVALID_VALUE, Res, fail};

/// `dim3` (and `uint3`): passed by value in launches.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

/// A pointer the program passes for the runtime to store a result in (`int *count`...).
#[repr(transparent)]
#[derive(Debug)]
pub struct Out<T>(*mut T);

impl<T> Out<T> {
    /// Stores `v`; a null pointer is `cudaErrorInvalidValue`.
    pub fn set(&self, v: T) -> Res {
        if self.0.is_null() {
            return fail(INVALID_VALUE);
        }
        // SAFETY: `Out` is only ever an argument of an exported function: the C caller passes
        // a pointer to writable storage for a `T` (the function's documented contract); null
        // was refused above, alignment is not assumed.
        unsafe { self.0.write_unaligned(v) };
        Ok(())
    }

    /// Whether the program passed null (for optional outputs).
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }

    /// The raw pointer (to hand to the driver, which writes through it itself).
    pub fn raw(&self) -> *mut T {
        self.0
    }

    /// An `Out` over a pointer of the runtime's own (tests, internal forwarding).
    ///
    /// # Safety
    /// `p` is null or valid for reads and writes of a `T` while the `Out` is used.
    pub unsafe fn new(p: *mut T) -> Self {
        Self(p)
    }
}

impl<T: Copy> Out<T> {
    /// Reads the current value (for in/out parameters such as `cudaPopCallConfiguration`'s).
    pub fn get(&self) -> Res<T> {
        if self.0.is_null() {
            return fail(INVALID_VALUE);
        }
        // SAFETY: as in `set`, the caller's pointer addresses a readable `T`.
        Ok(unsafe { self.0.read_unaligned() })
    }
}
