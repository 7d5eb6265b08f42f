//! Per-thread scratch vectors the kernels reuse across calls.

/// outlive a graph, and a fresh vector per call (up to 2.4 MB for a linear layer's packed
/// rows) had its pages faulted in and zeroed every time. Its values are what the previous
/// user left (or the fill value where it grew): callers write before they read.
pub(crate) struct Scratch<T: 'static> {
    slot: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>,
    data: Vec<T>,
    len: usize,
}

impl<T: Copy> Scratch<T> {
    /// `len` values of `slot`'s vector, grown with `fill` where it is shorter.
    pub fn take(
        slot: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>,
        len: usize,
        fill: T,
    ) -> Self {
        let mut data = slot.take();
        if data.len() < len {
            data.resize(len, fill);
        }
        Scratch { slot, data, len }
    }
}

impl<T> std::ops::Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data[..self.len]
    }
}

impl<T> std::ops::DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data[..self.len]
    }
}

impl<T> Drop for Scratch<T> {
    fn drop(&mut self) {
        self.slot.set(std::mem::take(&mut self.data));
    }
}

// The [`Scratch`] vectors of the kernels, shared by all of them (and every instance), so
// that a thread keeps no more than the largest buffers any one kernel holds at once: a
// kernel takes each slot at most once at a time, its largest buffer from the first. Per
// thread, the largest are a linear layer's packed rows (2.4 MB at 3,072 inputs) and
// Winograd's transformed kernels, 36 values per input and output channel (2.4 MB at 128 ->
// 128 channels, 9.4 MB at 256 -> 256: DA3-large's head).
thread_local! {
    pub(crate) static SCRATCH_0: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(crate) static SCRATCH_1: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(crate) static SCRATCH_2: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(crate) static SCRATCH_3: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Words of bf16 pairs.
    pub(crate) static SCRATCH_PAIRS_0: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(crate) static SCRATCH_PAIRS_1: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}
