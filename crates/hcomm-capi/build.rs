//! Gives libhcomm.so its soname, `libhcomm.so.<major>`, so that programs linked against it find
//! the installed `libhcomm.so.<major>` link (`make install`) and a future incompatible version
//! can be installed beside it.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhcomm.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
