//! Build script: give the shared library a stable SONAME so that C programs linked against it
//! (tests/c, users' code) record `libump_alloc.so` and find it through the usual search path.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libump_alloc.so");
    }
}
