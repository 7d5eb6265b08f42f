//! Writing a file atomically: every file this crate and the `da3` command write (images, PFM,
//! JSON, exports, GGUF models, summaries) goes through [`write()`].
//!
//! The data goes to a new temporary file in the destination's folder, through a buffered
//! writer; the file is synced (`fsync`) and renamed over the destination, and the folder is
//! synced on Unix (best effort). A failure at any step, in the caller's format writer
//! included, removes the temporary file and leaves the destination as it was. Format writers
//! take any [`Write`]; the functions that write a path wrap them in [`write()`]:
//!
//! ```
//! use std::io::Write;
//! # fn main() -> Result<(), da3::atomic_file::WriteError> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("hello.txt");
//! fn hello(out: &mut dyn Write, name: &str) -> std::io::Result<()> {
//!     writeln!(out, "hello {name}")
//! }
//! da3::atomic_file::write(&path, |out| hello(out, "world"))?;
//! assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello world\n");
//! # Ok(()) }
//! ```

use std::fs::{File, Permissions};
use std::io::{self, BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The buffer between a format writer and the temporary file.
const BUFFER_BYTES: usize = 1 << 20;

/// A file that could not be written (nothing is left half-written).
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
pub struct WriteError {
    /// The file that could not be written.
    pub path: PathBuf,
    /// Why: the I/O error, the format writer's error, or a destination refused by
    /// [`check_writable`]'s rules.
    #[source]
    pub source: io::Error,
}

impl WriteError {
    fn new(path: &Path, source: io::Error) -> WriteError {
        WriteError {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Writes `path` through a temporary file in the same folder, renamed into place once
/// complete and synced, so that a failure never leaves a half-written file behind. Returns what
/// `write` returns.
///
/// `write` gets a buffered writer over the temporary file. The temporary file has an
/// unpredictable name and is created exclusively; it is removed on any error (`write`'s
/// included) and by [`remove_temporary_files`]. An existing `path` must be a regular file (a
/// directory, device, FIFO or symbolic link is refused and left untouched), and the new file
/// keeps its permissions; a new file gets the default ones.
pub fn write<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> Result<T, WriteError> {
    let permissions = check_target(path)?;
    let io = |source| WriteError::new(path, source);
    let (mut tmp, _registered) =
        Registered::create(&PENDING, path, permissions.as_ref()).map_err(io)?;
    let result = (|| {
        let mut out = BufWriter::with_capacity(BUFFER_BYTES, tmp.as_file_mut());
        let value = write(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?;
        if let Some(permissions) = permissions {
            tmp.as_file().set_permissions(permissions)?;
        }
        tmp.as_file().sync_all()?;
        Ok(value)
    })();
    let value = result.map_err(io)?;
    // Dropping the temporary file on a failed rename removes it.
    tmp.persist(path).map_err(|e| io(e.error))?;
    #[cfg(unix)]
    if let Ok(folder) = File::open(folder_of(path)) {
        // Makes the rename durable; the file is complete either way.
        let _ = folder.sync_all();
    }
    Ok(value)
}

/// Checks, before any work, that [`write()`] can write `path`: the folder exists and takes a new
/// file, and `path` is absent or a regular file. The error names `path`.
pub fn check_writable(path: &Path) -> Result<(), WriteError> {
    let permissions = check_target(path)?;
    Registered::create(&PENDING, path, permissions.as_ref())
        .map(drop)
        .map_err(|source| WriteError::new(path, source))
}

/// Removes the temporary files of [`write()`] calls still in progress, and makes every later
/// write fail before it creates one. For a program's SIGINT/SIGTERM handler, which then exits:
/// an interrupted write leaves nothing, whichever thread was writing and whenever the signal
/// came (a temporary file is created and registered under one lock, so the handler sees every
/// file that exists).
pub fn remove_temporary_files() {
    let mut pending = lock(&PENDING);
    pending.closed = true;
    pending.remove(|_| true);
    for dir in pending.dirs.drain(..) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A temporary folder (in the system's temporary folder, named `prefix` and a random suffix)
/// that [`remove_temporary_files`] removes with everything in it, as it removes the temporary
/// files of writes: for scratch data such as a video's extracted frames, which an interrupted
/// run must not leave behind. Dropping it removes it too.
pub struct TemporaryDir {
    dir: tempfile::TempDir,
}

impl TemporaryDir {
    /// Creates and registers the folder; refused once [`remove_temporary_files`] has run.
    pub fn new(prefix: &str) -> io::Result<TemporaryDir> {
        let mut pending = lock(&PENDING);
        if pending.closed {
            return Err(io::Error::new(
                ErrorKind::Interrupted,
                "the program is stopping (interrupted)",
            ));
        }
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        pending.dirs.push(dir.path().to_path_buf());
        Ok(TemporaryDir { dir })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TemporaryDir {
    fn drop(&mut self) {
        // Unregistered first: the `TempDir` removes the folder as it drops.
        lock(&PENDING).dirs.retain(|d| d != self.dir.path());
    }
}

/// The temporary files of the writes in progress, and whether the program is closing.
#[derive(Default)]
struct Pending {
    paths: Vec<PathBuf>,
    /// Temporary folders ([`TemporaryDir`]), removed with what they hold.
    dirs: Vec<PathBuf>,
    /// [`remove_temporary_files`] ran: no new temporary file may be created.
    closed: bool,
}

impl Pending {
    const fn new() -> Pending {
        Pending {
            paths: Vec::new(),
            dirs: Vec::new(),
            closed: false,
        }
    }

    /// Removes the temporary files that `which` picks.
    fn remove(&mut self, which: impl Fn(&Path) -> bool) {
        self.paths.retain(|path| {
            let remove = which(path);
            if remove {
                let _ = std::fs::remove_file(path);
            }
            !remove
        });
    }
}

/// The process's writes in progress, for [`remove_temporary_files`].
static PENDING: Mutex<Pending> = Mutex::new(Pending::new());

fn lock(pending: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    pending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps a temporary file's path in its [`Pending`] list while it exists.
struct Registered<'a> {
    list: &'a Mutex<Pending>,
    path: PathBuf,
}

impl<'a> Registered<'a> {
    /// A new temporary file beside `path`, created and registered in `list` under its lock,
    /// so that a cleanup sees it from the moment it exists; refused once `list` is closed.
    fn create(
        list: &'a Mutex<Pending>,
        path: &Path,
        permissions: Option<&Permissions>,
    ) -> io::Result<(tempfile::NamedTempFile, Registered<'a>)> {
        let mut pending = lock(list);
        if pending.closed {
            return Err(io::Error::new(
                ErrorKind::Interrupted,
                "the program is stopping (interrupted)",
            ));
        }
        let tmp = temporary_beside(path, permissions)?;
        pending.paths.push(tmp.path().to_path_buf());
        let registered = Registered {
            list,
            path: tmp.path().to_path_buf(),
        };
        Ok((tmp, registered))
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        lock(self.list).paths.retain(|p| p != &self.path);
    }
}

fn refused(path: &Path, kind: ErrorKind, why: String) -> WriteError {
    WriteError::new(path, io::Error::new(kind, why))
}

/// The folder an output file goes to.
fn folder_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Checks that `path` may be replaced by a new file: it names a file in an existing folder,
/// and is either absent or a regular file (not a directory, device, FIFO, socket or symbolic
/// link). Returns the permissions of the existing file, which the new one keeps.
fn check_target(path: &Path) -> Result<Option<Permissions>, WriteError> {
    if path.file_name().is_none() {
        return Err(refused(
            path,
            ErrorKind::InvalidInput,
            "not a file name".into(),
        ));
    }
    let folder = folder_of(path);
    match std::fs::metadata(folder) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(refused(
                path,
                ErrorKind::NotADirectory,
                format!("{} is not a folder", folder.display()),
            ))
        }
        Err(e) => {
            return Err(refused(
                path,
                e.kind(),
                format!("the folder {} does not exist ({e})", folder.display()),
            ))
        }
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(WriteError::new(path, e)),
    };
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(Some(meta.permissions()));
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link (name the file it points to)"
    } else {
        special_file_kind(&kind)
    };
    Err(refused(
        path,
        ErrorKind::AlreadyExists,
        format!("it is {what}, not a regular file; refusing to replace it"),
    ))
}

#[cfg(unix)]
fn special_file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_file_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// A new temporary file beside `path`, with an unpredictable name, created exclusively (it
/// cannot be a pre-existing file or a symbolic link someone planted).
fn temporary_beside(
    path: &Path,
    permissions: Option<&Permissions>,
) -> io::Result<tempfile::NamedTempFile> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // A new output gets the usual 0666 less the umask; a replaced one its own mode (set
        // exactly before the rename, since the umask applies here).
        let mode = permissions.map_or(0o666, |p| p.mode() & 0o7777);
        builder.permissions(Permissions::from_mode(mode));
    }
    #[cfg(not(unix))]
    let _ = permissions;
    builder.tempfile_in(folder_of(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.pfm");
        std::fs::write(&path, b"old").unwrap();
        let err = write(&path, |w| {
            w.write_all(b"half")?;
            Err::<(), _>(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("out.pfm") && err.to_string().contains("disk on fire"));
        assert_eq!(err.path, path);
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names_in(dir.path()), ["out.pfm"]);
    }

    #[test]
    fn a_failed_write_of_a_new_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.json");
        // Enough to go past the buffer: the temporary file has data when the writer fails.
        let err = write(&path, |w| {
            w.write_all(&vec![7; 3 * BUFFER_BYTES])?;
            assert_eq!(names_in(dir.path()).len(), 1, "a temporary file exists");
            Err::<(), _>(io::Error::other("format error"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("format error"), "{err}");
        assert!(
            names_in(dir.path()).is_empty(),
            "{:?}",
            names_in(dir.path())
        );
        // Nothing of this write is registered any more.
        assert!(!lock(&PENDING)
            .paths
            .iter()
            .any(|p| p.starts_with(dir.path())));
    }

    #[test]
    fn a_successful_write_replaces_the_file_and_returns_the_writers_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.gguf");
        std::fs::write(&path, b"old contents, longer than the new").unwrap();
        let written = write(&path, |w| {
            w.write_all(b"new")?;
            Ok(3u64)
        })
        .unwrap();
        assert_eq!(written, 3);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(names_in(dir.path()), ["out.gguf"]);
        // A relative path names a file of the current folder.
        assert!(folder_of(Path::new("out.gguf")) == Path::new("."));
    }

    #[test]
    fn an_interrupted_write_removes_its_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.pfm");
        std::fs::write(&path, b"old").unwrap();
        let err = write(&path, |w| {
            w.write_all(b"half")?;
            w.flush()?;
            assert_eq!(names_in(dir.path()).len(), 2, "a temporary file exists");
            // What the CLI's SIGINT handler does (`remove_temporary_files`) before it dies of
            // the signal, for this folder only: tests elsewhere write files at the same time.
            lock(&PENDING).remove(|p| p.starts_with(dir.path()));
            assert_eq!(names_in(dir.path()), ["out.pfm"]);
            Ok(())
        });
        assert!(err.is_err(), "the rename of a removed temporary file fails");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names_in(dir.path()), ["out.pfm"]);
        assert!(!lock(&PENDING)
            .paths
            .iter()
            .any(|p| p.starts_with(dir.path())));
    }

    /// A cleanup sees every temporary file that exists (created and registered under one
    /// lock), and once it has run no write creates another: a signal at any moment leaves
    /// nothing. (A list of its own: the process's list serves the other tests.)
    #[test]
    fn after_a_cleanup_no_temporary_file_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.ply");
        let list = Mutex::new(Pending::default());
        let (tmp, registered) = Registered::create(&list, &path, None).unwrap();
        assert_eq!(lock(&list).paths, [tmp.path().to_path_buf()]);
        // What remove_temporary_files does to the process's list.
        {
            let mut pending = lock(&list);
            pending.closed = true;
            pending.remove(|_| true);
        }
        assert!(
            names_in(dir.path()).is_empty(),
            "the cleanup removed the file"
        );
        drop((tmp, registered));
        let refused = Registered::create(&list, &path, None)
            .map(drop)
            .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Interrupted);
        assert!(
            names_in(dir.path()).is_empty(),
            "a closed list creates nothing"
        );
        assert!(lock(&list).paths.is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn a_replaced_file_keeps_its_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o640, 0o604] {
            let path = dir.path().join(format!("out{mode:o}.json"));
            std::fs::write(&path, b"old").unwrap();
            std::fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
            write(&path, |w| w.write_all(b"new")).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"new");
            let got = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(got, mode, "{}", path.display());
        }
    }

    #[cfg(unix)]
    #[test]
    fn special_files_and_links_are_refused_and_left_alone() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let before = std::fs::metadata("/dev/null").unwrap();
        let err = write(Path::new("/dev/null"), |w| w.write_all(b"x")).unwrap_err();
        assert!(err.to_string().contains("character device"), "{err}");
        let after = std::fs::metadata("/dev/null").unwrap();
        assert!(after.file_type() == before.file_type() && after.rdev() == before.rdev());
        assert!(check_writable(Path::new("/dev/null")).is_err());

        let target = dir.path().join("real.pfm");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("link.pfm");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = write(&link, |w| w.write_all(b"x")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let err = check_writable(&sub).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
        let err = check_writable(&target.join("x.pfm")).unwrap_err();
        assert!(err.to_string().contains("is not a folder"), "{err}");
        assert_eq!(names_in(dir.path()), ["link.pfm", "real.pfm", "sub"]);
    }
}
