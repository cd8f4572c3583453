//! `CUresult`: the values (generated from cuda.h), their names and texts, and how device
//! errors map onto them.

use crate::device::DeviceError;
pub use crate::gen_consts::*;
use crate::gen_errors::ERRORS;

/// The driver API's status code (`enum cudaError_enum`, an `int` in C).
pub type CUresult = u32;

/// The name and text of a code, `None` for a value cuda.h does not define.
pub fn describe(code: CUresult) -> Option<(&'static str, &'static str)> {
    ERRORS
        .iter()
        .find(|(v, _, _)| *v == code)
        .map(|(_, n, t)| (*n, *t))
}

/// The code a device error becomes.
pub fn from_device(e: &DeviceError) -> CUresult {
    match e {
        DeviceError::NoDevice(_) => CUDA_ERROR_NO_DEVICE,
        DeviceError::OutOfMemory(_) => CUDA_ERROR_OUT_OF_MEMORY,
        DeviceError::InvalidValue(_) => CUDA_ERROR_INVALID_VALUE,
        DeviceError::InvalidPtx(_) => CUDA_ERROR_INVALID_PTX,
        DeviceError::NotFound(_) => CUDA_ERROR_NOT_FOUND,
        DeviceError::LaunchFailed(_) => CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        DeviceError::IllegalAddress(_) => CUDA_ERROR_ILLEGAL_ADDRESS,
        DeviceError::Timeout(_) => CUDA_ERROR_LAUNCH_TIMEOUT,
        DeviceError::Fault(_) => CUDA_ERROR_LAUNCH_FAILED,
        DeviceError::NotSupported(_) => CUDA_ERROR_NOT_SUPPORTED,
    }
}

/// Whether a code is one of the sticky errors that end a context.
pub fn is_sticky(code: CUresult) -> bool {
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_HARDWARE_STACK_ERROR
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_agree_with_cuda_h() {
        assert_eq!(describe(0).unwrap().0, "CUDA_SUCCESS");
        assert_eq!(describe(700).unwrap().0, "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(CUDA_ERROR_NOT_SUPPORTED, 801);
        assert_eq!(CUDA_ERROR_INVALID_HANDLE, 400);
        assert!(describe(12345).is_none());
        assert!(is_sticky(from_device(&DeviceError::IllegalAddress(
            "x".into()
        ))));
        assert!(!is_sticky(from_device(&DeviceError::OutOfMemory(1))));
    }
}
