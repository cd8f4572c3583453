//! The launch configuration stack: `kernel<<<grid, block, shared, stream>>>(...)` compiles to
//! `__cudaPushCallConfiguration(grid, block, shared, stream)` followed by a call of the host
//! stub, which pops it (`__cudaPopCallConfiguration`) and launches. One stack per thread.

use std::cell::RefCell;

use crate::driver::Handle;
use crate::ffi::Dim3;

/// One pushed `<<<...>>>` configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallConfig {
    pub grid: Dim3,
    pub block: Dim3,
    pub shared: usize,
    pub stream: Handle,
}

/// How many configurations a thread may have pushed and not popped; beyond it the oldest is
/// dropped (a program pushing without launching cannot grow memory without bound).
pub const MAX_DEPTH: usize = 4096;

/// A bounded stack of configurations.
#[derive(Default, Debug)]
pub struct CallStack(Vec<CallConfig>);

impl CallStack {
    pub fn push(&mut self, c: CallConfig) {
        if self.0.len() == MAX_DEPTH {
            self.0.remove(0);
        }
        self.0.push(c);
    }

    pub fn pop(&mut self) -> Option<CallConfig> {
        self.0.pop()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

thread_local! {
    static STACK: RefCell<CallStack> = RefCell::new(CallStack::default());
}

/// Pushes on the calling thread's stack.
pub fn push(c: CallConfig) {
    STACK.with(|s| s.borrow_mut().push(c));
}

/// Pops from the calling thread's stack.
pub fn pop() -> Option<CallConfig> {
    STACK.with(|s| s.borrow_mut().pop())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(x: u32) -> CallConfig {
        CallConfig {
            grid: Dim3 { x, y: 1, z: 1 },
            block: Dim3 { x: 32, y: 1, z: 1 },
            shared: x as usize,
            stream: std::ptr::null_mut(),
        }
    }

    #[test]
    fn nested_launches_pop_in_reverse_order() {
        let mut s = CallStack::default();
        s.push(conf(1));
        s.push(conf(2));
        assert_eq!(s.pop(), Some(conf(2)));
        assert_eq!(s.pop(), Some(conf(1)));
        assert_eq!(s.pop(), None);
    }

    #[test]
    fn depth_is_bounded() {
        let mut s = CallStack::default();
        for i in 0..(MAX_DEPTH as u32 + 10) {
            s.push(conf(i));
        }
        assert_eq!(s.len(), MAX_DEPTH);
        assert_eq!(s.pop(), Some(conf(MAX_DEPTH as u32 + 9)));
    }

    #[test]
    fn stacks_are_per_thread() {
        push(conf(7));
        std::thread::spawn(|| assert_eq!(pop(), None))
            .join()
            .unwrap();
        assert_eq!(pop(), Some(conf(7)));
    }
}
