//! Generates the C header from the sources into `$OUT_DIR/da3.h`, where `tests/header.rs`
//! compares it with the committed `include/da3.h`. cbindgen is a build dependency rather than
//! a dev-dependency so that its dependencies' features do not unify with the library's: the
//! tests then link the same `da3` build as `cargo build -p da3-capi`.

fn main() {
    let crate_dir = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("capi/cbindgen.toml reads");
    // The sources alone (no `cargo metadata`): the API lives in this crate's files.
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen reads capi/src")
        .write_to_file(out_dir.join("da3.h"));
}
