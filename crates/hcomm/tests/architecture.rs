//! The architecture, checked: every module of the library belongs to one layer of
//! docs/ARCHITECTURE.md, and no module uses a layer above its own; and nothing in the
//! repository cites a document that is not in it.
//!
//! A module's uses are the `crate::` paths of its source (in `use` lines, braced groups
//! included, and inline paths), and the crate root's re-exports (`crate::Communicator` is a
//! use of `comm`). Comments do not count.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers of the library, bottom first, as docs/ARCHITECTURE.md describes them. A module
/// may use modules of its own layer and of the layers below.
const LAYERS: &[(&str, &[&str])] = &[
    ("foundation", &["error", "sync", "dtype", "rng", "fuzz"]),
    ("kernels", &["reduce"]),
    ("bootstrap", &["bootstrap", "topology"]),
    ("transport", &["transport"]),
    ("configuration", &["config"]),
    ("observability", &["observe"]),
    ("point-to-point engine", &["p2p"]),
    (
        "collectives: algorithms, schedules and their execution",
        &["coll"],
    ),
    ("communicator", &["comm"]),
];

/// The layer index of `module`, if it is declared.
fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// The library's source directory.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/p2p/watch.rs` and `src/p2p.rs`:
/// `p2p`); `None` for the crate root.
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).expect("a file under src/");
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(m) => Some(m.to_string()),
        None => Some(first.to_string()),
    }
}

/// The source without its comments (line comments; block comments are not used here).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().map(|(i, line)| {
        let code = match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        (i + 1, code)
    })
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segments after each `crate::` in `code`, with the line of each: `use
/// crate::{a::X, b}` gives `a` and `b`. Braced groups may span lines.
fn crate_uses(code: &[(usize, &str)]) -> Vec<(usize, String)> {
    let text: String = code.iter().map(|(_, l)| format!("{l}\n")).collect();
    let line_at = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("crate::") {
        let at = from + found;
        from = at + "crate::".len();
        if text[..at].ends_with(|c: char| is_ident(c) || c == ':') {
            continue; // `hcomm_crate::`, `$crate::`: not this crate's root.
        }
        let rest = &text[from..];
        if let Some(group) = rest.strip_prefix('{') {
            // The segments right after `{` or a `,` at depth 0 of the group.
            let mut depth = 0;
            let mut expect = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => expect = true,
                    c if expect && is_ident(c) => {
                        let name: String =
                            group[i..].chars().take_while(|&c| is_ident(c)).collect();
                        out.push((line_at(from + 1 + i), name));
                        expect = false;
                    }
                    c if !c.is_whitespace() => expect = false,
                    _ => {}
                }
            }
        } else {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                out.push((line_at(at), name));
            }
        }
    }
    out
}

/// The crate root's re-exports: name -> the module it comes from (`Communicator` -> `comm`).
fn reexports() -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    let mut map = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        let names = names
            .trim_end_matches(';')
            .trim_matches(|c| c == '{' || c == '}');
        for name in names.split(',') {
            let name = name.split(" as ").last().unwrap_or(name).trim();
            map.insert(name.to_string(), module.to_string());
        }
    }
    map
}

/// The uses of `module` (source `text`) that go to a layer above its own, as messages.
fn violations(
    module: &str,
    file: &str,
    text: &str,
    reexports: &BTreeMap<String, String>,
) -> Vec<String> {
    let Some(own) = layer(module) else {
        return vec![format!(
            "{file}: module `{module}` is in no layer of LAYERS"
        )];
    };
    let code: Vec<(usize, &str)> = code_lines(text).collect();
    crate_uses(&code)
        .into_iter()
        .filter_map(|(line, name)| {
            let target = reexports.get(&name).cloned().unwrap_or(name);
            let theirs = layer(&target)?;
            (theirs > own).then(|| {
                format!(
                    "{file}:{line}: `{module}` ({}) uses `{target}` ({}), a layer above",
                    LAYERS[own].0, LAYERS[theirs].0
                )
            })
        })
        .collect()
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let reexports = reexports();
    assert!(
        reexports.get("Communicator").map(String::as_str) == Some("comm"),
        "the crate root's re-exports were not read: {reexports:?}"
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        // A file's unit tests (its `#[cfg(test)] mod` at the end) may build their fixtures
        // from upper layers; the library code before them may not.
        let library = text
            .find("\n#[cfg(test)]\nmod ")
            .map_or(text.as_str(), |at| &text[..at]);
        let name = file.strip_prefix(src()).unwrap().display().to_string();
        problems.extend(violations(&module, &name, library, &reexports));
        checked += 1;
    }
    assert!(checked > 40, "only {checked} source files found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_finds_uses_of_upper_layers_in_every_form() {
    let reexports = reexports();
    let bad = "use crate::p2p::Engine;\n\
               use crate::{error::Error,\n    comm::{Batch, Request}};\n\
               fn f() -> crate::Communicator { todo!() }\n\
               // crate::exec in a comment does not count\n";
    let found = violations("transport", "transport/x.rs", bad, &reexports);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found[0].starts_with("transport/x.rs:1: `transport`"),
        "{found:#?}"
    );
    assert!(
        found[1].contains(":3: ") && found[1].contains("`comm`"),
        "{found:#?}"
    );
    assert!(
        found[2].contains(":4: ") && found[2].contains("`comm`"),
        "{found:#?}"
    );
    let fine = "use crate::error::Error;\nuse crate::{sync::lock, dtype};\n";
    assert!(violations("transport", "t.rs", fine, &reexports).is_empty());
    assert_eq!(violations("newthing", "n.rs", fine, &reexports).len(), 1);
}

/// Every text file of the repository, but build outputs, virtual environments and git's own.
fn repository_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable directory") {
        let path = entry.expect("directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            repository_files(&path, out);
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            if !text.contains('\0') {
                out.push(path);
            }
        }
    }
}

#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    repository_files(&root, &mut files);
    // Spelled in pieces, so that this file does not match itself.
    let outside = [concat!("SPEC", " F"), concat!("../", "shared/")];
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            if outside.iter().any(|p| line.contains(p)) {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(files.len() > 50, "only {} files found", files.len());
    assert!(found.is_empty(), "{}", found.join("\n"));
}
