//! Inputs named on the command line: files, folders (their images, sorted), glob patterns
//! and videos, as `batch` and `stream` take them.

use anyhow::{bail, Context as _};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// What a folder is searched for: every format `da3::load_image` reads.
pub const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "webp", "tif", "tiff", "bmp", "gif"];

fn extension_in(path: &Path, list: &[&str]) -> bool {
    path.extension()
        .is_some_and(|e| list.contains(&e.to_string_lossy().to_lowercase().as_str()))
}

/// Files, folders and globs to a list of paths (folders and globs sorted, duplicates dropped),
/// and the files of the folders that are no image `da3` reads (named in the summary).
pub fn expand_inputs(inputs: &[String]) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for input in inputs {
        let path = Path::new(input);
        if path.is_dir() {
            let (mut files, mut others): (Vec<PathBuf>, Vec<PathBuf>) = std::fs::read_dir(path)
                .with_context(|| format!("reading folder {input}"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .partition(|p| extension_in(p, IMAGE_EXTENSIONS));
            files.sort();
            others.sort();
            out.extend(files);
            skipped.extend(others);
        } else if !path.exists() && input.contains(['*', '?', '[']) {
            let mut files: Vec<PathBuf> = glob::glob(input)
                .with_context(|| format!("glob pattern {input}"))?
                .filter_map(Result::ok)
                .filter(|p| p.is_file())
                .collect();
            if files.is_empty() {
                bail!("{input}: the pattern matches no file");
            }
            files.sort();
            out.extend(files);
        } else {
            // A missing file is reported with the results, not here.
            out.push(path.to_path_buf());
        }
    }
    let mut seen = HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    Ok((out, skipped))
}
