//! A file mapped read-only into memory: the bytes model files hand to ggml's buffers. Here,
//! in the layer that holds the crate's `unsafe` code, so that the GGUF reader above it has
//! none.

use std::fs::File;
use std::io;
use std::ops::{Deref, Range};

/// A read-only memory map of a whole file.
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `file` (opened for reading).
    ///
    /// The caller takes on what no mapping can promise: the bytes belong to a file that can
    /// change behind this process's back. A write by another process changes bytes under the
    /// borrows this type hands out (in practice the reader sees inconsistent data; every
    /// access is bounds-checked against the map's fixed length, so none goes out of it), and
    /// a truncation makes reads of the lost pages raise SIGBUS. A rename-replace is harmless
    /// (the map keeps the old inode). Readers that must survive a truncation read with
    /// positioned reads instead, as the GGUF loader does.
    pub fn map(file: &File) -> io::Result<MappedFile> {
        // SAFETY: `Mmap::map` is unsafe because the mapped bytes belong to a file that can
        // change behind our back. It is opened read-only and never written through the map;
        // what another process may still do to the file is this function's documented
        // contract with its callers (like llama.cpp, candle and safetensors do). Mapping
        // touches no page.
        let map = unsafe { memmap2::Mmap::map(file) }?;
        Ok(MappedFile { map })
    }

    /// Lets the pages of `range` leave this process's resident memory (they are read again
    /// from the file if touched later). No effect where the system has no such advice.
    pub fn release(&self, range: Range<usize>) {
        #[cfg(unix)]
        if range.start <= range.end && range.end <= self.map.len() {
            // SAFETY: a read-only file mapping: MADV_DONTNEED drops its pages and a later read
            // faults the same bytes in again from the file, as after an eviction under memory
            // pressure, so no slice handed out sees its contents change; the range lies within
            // the map (checked above).
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}
