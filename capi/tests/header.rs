//! The committed `include/da3.h` is what cbindgen generates from the sources now: a change to
//! the C API that did not regenerate the header fails here. `DA3_BLESS_HEADER=1 cargo test -p
//! da3-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn the_committed_header_is_generated_from_the_sources() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    // The sources alone (no `cargo metadata`): the API lives in this crate's files.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen reads the sources");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let header = crate_dir.join("include/da3.h");
    if std::env::var_os("DA3_BLESS_HEADER").is_some() {
        std::fs::write(&header, &generated).unwrap();
        return;
    }
    let committed = std::fs::read(&header).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date: regenerate it with DA3_BLESS_HEADER=1 cargo test -p da3-capi --test \
         header, and commit it",
        header.display()
    );
}
