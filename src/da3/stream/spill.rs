//! What the stream keeps of every frame once its window is aligned: a small record in memory
//! (where the frame is, its window, its camera in window coordinates) and its depth,
//! confidence and colours, subsampled, in an anonymous temporary file. Memory then stays
//! flat over the length of a video; the file grows with it and is gone when the stream is
//! dropped, or the process dies (it never has a name on Linux).

use crate::da3::Error;
use crate::geometry::sim3::Sim3;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};

/// One frame's place in the store and what the final passes need of it without reading it.
#[derive(Debug, Clone)]
pub(crate) struct FrameRecord {
    /// Index of the frame in the stream.
    pub index: usize,
    /// Its name (the file it came from, or `frame000123`).
    pub name: String,
    /// The window whose prediction gave its depth and camera.
    pub window: usize,
    /// Camera-to-window transform (rigid) from that window's prediction.
    pub camera_to_window: Sim3,
    /// Intrinsics at the processed resolution.
    pub intrinsics: [[f64; 3]; 3],
    /// Processed width and height.
    pub processed_size: (usize, usize),
    /// Median predicted depth (window units) of its confident pixels.
    pub median_depth: f32,
    /// Mean confidence of its pixels.
    pub mean_confidence: f32,
    offset: u64,
}

/// A frame's maps as stored: every `stride`-th pixel of the processed maps.
pub(crate) struct StoredMaps {
    pub width: usize,
    pub height: usize,
    pub depth: Vec<f32>,
    pub confidence: Vec<f32>,
    pub colors: Vec<[u8; 3]>,
    /// Intrinsics of the subsampled maps.
    pub intrinsics: [[f64; 3]; 3],
}

/// The subsampling of a processed map: the pixel `(x * stride, y * stride)` of the processed
/// map becomes `(x, y)`, so pixel `u = stride * x`: the intrinsics divide by `stride`
/// (pixel centres at integer coordinates, as the official point maps have them).
pub(crate) fn subsampled_intrinsics(k: &[[f64; 3]; 3], stride: usize) -> [[f64; 3]; 3] {
    let s = stride as f64;
    [
        [k[0][0] / s, 0.0, k[0][2] / s],
        [0.0, k[1][1] / s, k[1][2] / s],
        [0.0, 0.0, 1.0],
    ]
}

/// The frames' maps in an anonymous temporary file, appended as windows are aligned.
pub(crate) struct FrameStore {
    file: BufWriter<File>,
    end: u64,
    stride: usize,
    records: Vec<FrameRecord>,
    /// Key frames' processed images for loop closure: (frame index, offset, width, height).
    images: Vec<(usize, u64, usize, usize)>,
}

fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::Input(format!(
        "stream frame store (a temporary file): {what}: {e}"
    ))
}

impl FrameStore {
    pub fn new(stride: usize) -> Result<FrameStore, Error> {
        let file = tempfile::tempfile().map_err(|e| io_error("cannot create it", e))?;
        Ok(FrameStore {
            file: BufWriter::new(file),
            end: 0,
            stride: stride.max(1),
            records: Vec::new(),
            images: Vec::new(),
        })
    }

    pub fn records(&self) -> &[FrameRecord] {
        &self.records
    }

    /// Bytes written to the temporary file so far.
    pub fn file_bytes(&self) -> u64 {
        self.end
    }

    fn append(&mut self, bytes: &[u8]) -> Result<u64, Error> {
        let offset = self.end;
        self.file
            .write_all(bytes)
            .map_err(|e| io_error("cannot write to it", e))?;
        self.end += bytes.len() as u64;
        Ok(offset)
    }

    /// Stores a frame's processed maps (subsampled) and keeps its record.
    pub fn push(
        &mut self,
        mut record: FrameRecord,
        depth: &[f32],
        confidence: &[f32],
        image: &[u8],
    ) -> Result<(), Error> {
        let (width, height) = record.processed_size;
        let stride = self.stride;
        let (w, h) = (width.div_ceil(stride), height.div_ceil(stride));
        let mut bytes = Vec::with_capacity(w * h * 11);
        for y in (0..height).step_by(stride) {
            for x in (0..width).step_by(stride) {
                bytes.extend_from_slice(&depth[y * width + x].to_le_bytes());
            }
        }
        for y in (0..height).step_by(stride) {
            for x in (0..width).step_by(stride) {
                bytes.extend_from_slice(&confidence[y * width + x].to_le_bytes());
            }
        }
        for y in (0..height).step_by(stride) {
            for x in (0..width).step_by(stride) {
                let i = (y * width + x) * 3;
                bytes.extend_from_slice(&image[i..i + 3]);
            }
        }
        record.offset = self.append(&bytes)?;
        self.records.push(record);
        Ok(())
    }

    /// A new record (its offset is set by [`FrameStore::push`]).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        index: usize,
        name: String,
        window: usize,
        camera_to_window: Sim3,
        intrinsics: [[f64; 3]; 3],
        processed_size: (usize, usize),
        median_depth: f32,
        mean_confidence: f32,
    ) -> FrameRecord {
        FrameRecord {
            index,
            name,
            window,
            camera_to_window,
            intrinsics,
            processed_size,
            median_depth,
            mean_confidence,
            offset: 0,
        }
    }

    fn read_at(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        self.file
            .flush()
            .map_err(|e| io_error("cannot write to it", e))?;
        let file = self.file.get_mut();
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| io_error("cannot seek in it", e))?;
        let mut bytes = vec![0u8; len];
        file.read_exact(&mut bytes)
            .map_err(|e| io_error("cannot read it back", e))?;
        file.seek(SeekFrom::Start(self.end))
            .map_err(|e| io_error("cannot seek in it", e))?;
        Ok(bytes)
    }

    /// The stored maps of the `i`-th record.
    pub fn maps(&mut self, i: usize) -> Result<StoredMaps, Error> {
        let record = &self.records[i];
        let (width, height) = record.processed_size;
        let (w, h) = (width.div_ceil(self.stride), height.div_ceil(self.stride));
        let intrinsics = subsampled_intrinsics(&record.intrinsics, self.stride);
        let n = w * h;
        let bytes = self.read_at(record.offset, n * 11)?;
        let floats = |range: &[u8]| -> Vec<f32> {
            range
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let depth = floats(&bytes[..n * 4]);
        let confidence = floats(&bytes[n * 4..n * 8]);
        let colors = bytes[n * 8..]
            .chunks_exact(3)
            .map(|c| [c[0], c[1], c[2]])
            .collect();
        Ok(StoredMaps {
            width: w,
            height: h,
            depth,
            confidence,
            colors,
            intrinsics,
        })
    }

    /// Keeps a key frame's processed image for loop closure.
    pub fn push_image(&mut self, frame: usize, image: &crate::da3::Image) -> Result<(), Error> {
        let offset = self.append(&image.data)?;
        self.images.push((frame, offset, image.width, image.height));
        Ok(())
    }

    /// The kept image of `frame`, if it was kept.
    pub fn image(&mut self, frame: usize) -> Result<Option<crate::da3::Image>, Error> {
        let Some(&(_, offset, width, height)) = self.images.iter().find(|e| e.0 == frame) else {
            return Ok(None);
        };
        let data = self.read_at(offset, width * height * 3)?;
        let image = crate::da3::Image::new(width, height, data)?;
        Ok(Some(image))
    }

    /// The position in [`FrameStore::records`] of frame `index`.
    pub fn position(&self, index: usize) -> Option<usize> {
        // Records are pushed in frame order.
        self.records.binary_search_by_key(&index, |r| r.index).ok()
    }

    /// The subsampling stride of the stored maps.
    pub fn stride(&self) -> usize {
        self.stride
    }
}
