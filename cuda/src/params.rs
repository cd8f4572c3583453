//! Kernel parameters laid out from the PTX entry's signature (`ptx::EntryInfo`: each
//! parameter's offset, size and alignment, structs by value as byte arrays), from either form
//! `cuLaunchKernel` accepts: `kernelParams` (one pointer per parameter) or `extra`
//! (`CU_LAUNCH_PARAM_BUFFER_POINTER` / `CU_LAUNCH_PARAM_BUFFER_SIZE`: the buffer already laid
//! out, its size checked against the signature's).

use std::ffi::c_void;

use thiserror::Error;

/// Why the parameters cannot be laid out (`CUDA_ERROR_INVALID_VALUE`).
#[derive(Debug, Error, PartialEq)]
pub enum ParamError {
    #[error("both kernelParams and extra were given")]
    BothForms,
    #[error("the kernel takes {0} parameters and none were given")]
    Missing(usize),
    #[error("parameter {0} is a null pointer")]
    NullArg(usize),
    #[error("extra: the buffer is {given} bytes, the kernel's parameters are {expected}")]
    SizeMismatch { given: usize, expected: usize },
    #[error("extra: {0}")]
    BadExtra(&'static str),
}

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`.
const END: usize = 0;
const BUFFER_POINTER: usize = 1;
const BUFFER_SIZE: usize = 2;
/// Pairs read from `extra` at most (it must end with CU_LAUNCH_PARAM_END before).
const MAX_EXTRA_PAIRS: usize = 16;

/// The `.param` buffer of `entry` from the program's arguments.
///
/// # Safety
/// `kernel_params`, if not null, points to one readable pointer per parameter of the entry,
/// each to a readable value of that parameter's size; `extra`, if not null, to
/// `CU_LAUNCH_PARAM_*` pairs ending with `CU_LAUNCH_PARAM_END`, whose buffer and size
/// pointers are readable. (What the driver API asks of the program: a null pointer among
/// them is caught, anything else the program promises.)
pub unsafe fn lay_out(
    entry: &ptx::EntryInfo,
    kernel_params: *const *const c_void,
    extra: *const *const c_void,
) -> Result<Vec<u8>, ParamError> {
    let size = entry.param_size as usize;
    let mut buf = vec![0u8; size];
    match (kernel_params.is_null(), extra.is_null()) {
        (false, false) => Err(ParamError::BothForms),
        (true, true) if entry.params.is_empty() => Ok(buf),
        (true, true) => Err(ParamError::Missing(entry.params.len())),
        (false, true) => {
            for (i, p) in entry.params.iter().enumerate() {
                // SAFETY: the caller promises one pointer per parameter.
                let arg = unsafe { *kernel_params.add(i) };
                if arg.is_null() {
                    return Err(ParamError::NullArg(i));
                }
                let at = p.offset as usize;
                // SAFETY: the program promises `size` readable bytes behind each argument;
                // the destination is inside `buf` (offset + size <= param_size by the parser).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        arg.cast::<u8>(),
                        buf[at..at + p.size as usize].as_mut_ptr(),
                        p.size as usize,
                    )
                };
            }
            Ok(buf)
        }
        (true, false) => {
            let mut ptr: *const u8 = std::ptr::null();
            let mut given: Option<usize> = None;
            for k in 0..MAX_EXTRA_PAIRS {
                // SAFETY: the caller promises pairs up to CU_LAUNCH_PARAM_END.
                let key = unsafe { *extra.add(2 * k) } as usize;
                if key == END {
                    break;
                }
                // SAFETY: as above: a key other than END is followed by its value.
                let value = unsafe { *extra.add(2 * k + 1) };
                match key {
                    BUFFER_POINTER => ptr = value.cast(),
                    BUFFER_SIZE if value.is_null() => {
                        return Err(ParamError::BadExtra("null size"));
                    }
                    // SAFETY: CU_LAUNCH_PARAM_BUFFER_SIZE's value points to a size_t.
                    BUFFER_SIZE => given = Some(unsafe { *value.cast::<usize>() }),
                    _ => return Err(ParamError::BadExtra("unknown key")),
                }
                if k + 1 == MAX_EXTRA_PAIRS {
                    return Err(ParamError::BadExtra("no CU_LAUNCH_PARAM_END"));
                }
            }
            let given = given.ok_or(ParamError::BadExtra("no CU_LAUNCH_PARAM_BUFFER_SIZE"))?;
            if given != size {
                return Err(ParamError::SizeMismatch {
                    given,
                    expected: size,
                });
            }
            if size > 0 {
                if ptr.is_null() {
                    return Err(ParamError::BadExtra("no CU_LAUNCH_PARAM_BUFFER_POINTER"));
                }
                // SAFETY: the program promises `given` (== size) readable bytes.
                unsafe { std::ptr::copy_nonoverlapping(ptr, buf.as_mut_ptr(), size) };
            }
            Ok(buf)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> ptx::EntryInfo {
        let m = ptx::parse(
            ".version 8.0\n.target sm_80\n.address_size 64\n\
             .visible .entry k(.param .u32 a, .param .u64 b, .param .align 8 .b8 s[12])\n{\nret;\n}\n",
        )
        .unwrap();
        m.entry("k").unwrap().clone()
    }

    #[test]
    fn both_forms_lay_out_the_same_bytes() {
        let e = entry();
        assert_eq!(e.param_size, 28);
        let a = 7u32;
        let b = 0x1122_3344_5566_7788u64;
        let s = [9u8; 12];
        let args: [*const c_void; 3] = [
            (&raw const a).cast(),
            (&raw const b).cast(),
            s.as_ptr().cast(),
        ];
        // SAFETY: three valid pointers to values of the parameters' sizes.
        let buf = unsafe { lay_out(&e, args.as_ptr(), std::ptr::null()) }.unwrap();
        assert_eq!(&buf[0..4], &7u32.to_le_bytes());
        assert_eq!(&buf[8..16], &b.to_le_bytes());
        assert_eq!(&buf[16..28], &[9u8; 12]);
        let size = buf.len();
        let extra: [*const c_void; 5] = [
            BUFFER_POINTER as *const c_void,
            buf.as_ptr().cast(),
            BUFFER_SIZE as *const c_void,
            (&raw const size).cast(),
            END as *const c_void,
        ];
        // SAFETY: a well-formed extra array.
        let again = unsafe { lay_out(&e, std::ptr::null(), extra.as_ptr()) }.unwrap();
        assert_eq!(again, buf);
        let wrong = size - 4;
        let extra_bad: [*const c_void; 5] = [
            BUFFER_POINTER as *const c_void,
            buf.as_ptr().cast(),
            BUFFER_SIZE as *const c_void,
            (&raw const wrong).cast(),
            END as *const c_void,
        ];
        // SAFETY: a well-formed extra array with the wrong size.
        let err = unsafe { lay_out(&e, std::ptr::null(), extra_bad.as_ptr()) }.unwrap_err();
        assert_eq!(
            err,
            ParamError::SizeMismatch {
                given: 24,
                expected: 28
            }
        );
        let with_null: [*const c_void; 3] = [args[0], std::ptr::null(), args[2]];
        // SAFETY: the null is caught before it is read through.
        let err = unsafe { lay_out(&e, with_null.as_ptr(), std::ptr::null()) }.unwrap_err();
        assert_eq!(err, ParamError::NullArg(1));
        // SAFETY: no pointers.
        let err = unsafe { lay_out(&e, std::ptr::null(), std::ptr::null()) }.unwrap_err();
        assert_eq!(err, ParamError::Missing(3));
    }
}
