//! The committed `include/da3.h` is the header cbindgen generates from the sources now (the
//! build script writes it to `$OUT_DIR`): a change to the C API that did not regenerate the
//! header fails here. `DA3_BLESS_HEADER=1 cargo test -p da3-capi --test header` rewrites it.

use std::path::Path;

const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/da3.h"));

#[test]
fn the_committed_header_is_generated_from_the_sources() {
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/da3.h");
    if std::env::var_os("DA3_BLESS_HEADER").is_some() {
        std::fs::write(&header, GENERATED).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        committed == GENERATED,
        "{} is out of date: regenerate it with DA3_BLESS_HEADER=1 cargo test -p da3-capi --test \
         header, and commit it",
        header.display()
    );
}
