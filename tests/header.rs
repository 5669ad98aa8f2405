//! The checked-in C header must equal what cbindgen generates from the source.
//! Regenerate with `UMP_ALLOC_BLESS=1 cargo test --test header`.

use std::path::PathBuf;

#[test]
fn header_is_current() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let path = root.join("include/ump_alloc.h");
    if std::env::var_os("UMP_ALLOC_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/ump_alloc.h is stale: run `UMP_ALLOC_BLESS=1 cargo test --test header` and commit it"
    );
}

#[test]
fn every_export_is_documented_and_prefixed() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("include/ump_alloc.h")).unwrap();
    let lines: Vec<&str> = header.lines().collect();
    let mut exports = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        // A declaration starts at column 0 with a '(' and is not a comment, macro or typedef.
        let decl = line.contains('(')
            && !line.starts_with(char::is_whitespace)
            && !line.starts_with("//")
            && !line.starts_with("/*")
            && !line.starts_with('#')
            && !line.starts_with("typedef");
        if !decl {
            continue;
        }
        let name = line
            .split('(')
            .next()
            .unwrap()
            .split_whitespace()
            .last()
            .unwrap()
            .trim_start_matches('*');
        assert!(
            name.starts_with("ump_"),
            "export {name} lacks the ump_ prefix"
        );
        assert!(
            lines[i - 1].starts_with("//"),
            "export {name} has no doc comment"
        );
        exports.push(name.to_string());
    }
    for must in [
        "ump_malloc",
        "ump_calloc",
        "ump_realloc",
        "ump_free",
        "ump_last_error",
        "ump_cupy_malloc",
        "ump_torch_free",
        "ump_identify",
        "ump_capabilities",
    ] {
        assert!(
            exports.iter().any(|e| e == must),
            "{must} missing from the header"
        );
    }
    for line in lines
        .iter()
        .filter(|l| l.starts_with("struct ") || l.starts_with("enum ") || l.starts_with("typedef "))
    {
        let name = line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .trim_end_matches([';', '{']);
        assert!(
            name.starts_with("ump_"),
            "type {name} lacks the ump_ prefix"
        );
    }
    assert!(
        !header.contains("/*") || header.matches("/*").count() == header.matches("*/").count(),
        "nested comment opener"
    );
    for line in lines.iter().filter(|l| l.starts_with("#define ")) {
        let name = line.split_whitespace().nth(1).unwrap();
        assert!(
            name.starts_with("UMP_"),
            "constant {name} lacks the UMP_ prefix"
        );
    }
}
