//! The checked-in `include/hcomm/hcomm.h` is what cbindgen makes of the code.

use std::path::Path;

#[test]
fn checked_in_header_matches_the_code() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header")
        .write(&mut generated);
    let path = dir.join("include/hcomm/hcomm.h");
    if std::env::var_os("HCOMM_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("writing the header");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is not what the code declares: regenerate it with \
         `HCOMM_UPDATE_HEADER=1 cargo nextest run -p hcomm-capi -E 'test(header)'` and commit it",
        path.display()
    );
}
