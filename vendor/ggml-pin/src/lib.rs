//! Empty: this crate exists only to pin a package version (see Cargo.toml).
