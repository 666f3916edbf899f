//! `docs/errors.md` documents every error code, and every error's message points to its entry.

use hcomm::{Error, ErrorCode, ErrorInfo, ERRORS_DOC};

/// The text before the first `## ` heading, and the sections: (heading, body).
fn sections() -> (String, Vec<(String, String)>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/errors.md");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut intro = String::new();
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            out.push((h.trim().to_string(), String::new()));
        } else {
            let body = match out.last_mut() {
                Some((_, body)) => body,
                None => &mut intro,
            };
            body.push_str(line);
            body.push('\n');
        }
    }
    (intro, out)
}

/// One error of each code, with a message naming a peer.
fn one_of_each() -> Vec<Error> {
    let m = || "rank 3 did something".to_string();
    vec![
        Error::Init(ErrorInfo::new(m()).into()),
        Error::NoMem(ErrorInfo::new(m()).into()),
        Error::Timeout(ErrorInfo::new(m()).into()),
        Error::InvalidArgument(ErrorInfo::new(m()).into()),
        Error::PeerLost(ErrorInfo::new(m()).into()),
        Error::Mismatch(ErrorInfo::new(m()).into()),
        Error::Truncated(ErrorInfo::new(m()).into()),
        Error::Transport(ErrorInfo::new(m()).into()),
        Error::NotSupported(ErrorInfo::new(m()).into()),
        Error::Aborted(ErrorInfo::new(m()).into()),
        Error::Internal(ErrorInfo::new(m()).into()),
        Error::Revoked(ErrorInfo::new(m()).into()),
        Error::Quorum(ErrorInfo::new(m()).into()),
    ]
}

#[test]
fn every_code_has_an_entry_with_causes_and_fixes() {
    let (intro, sections) = sections();
    for code in ErrorCode::ALL {
        let entry = code.doc_entry();
        let found: Vec<&(String, String)> = sections.iter().filter(|(h, _)| h == entry).collect();
        assert_eq!(
            found.len(),
            1,
            "docs/errors.md needs one `## {entry}` section"
        );
        let body = &found[0].1;
        assert!(
            body.contains(&format!("Code {},", code as i32)),
            "the {entry} entry must give the code's number {}",
            code as i32
        );
        assert!(
            intro.contains(&format!("[{entry}](#{entry})")),
            "the index at the top must link to the {entry} entry"
        );
        if code != ErrorCode::Success {
            // A table of causes and fixes with at least one row.
            assert!(
                body.contains("| cause")
                    && body.lines().filter(|l| l.starts_with("| ")).count() >= 2,
                "the {entry} entry needs a table of causes and fixes"
            );
        }
    }
    // Every section is a code's: no stale entries.
    for (h, _) in &sections {
        assert!(
            ErrorCode::ALL.iter().any(|c| c.doc_entry() == h),
            "docs/errors.md has a section `## {h}` that is no error code's entry"
        );
    }
}

#[test]
fn every_error_message_names_its_entry() {
    let errors = one_of_each();
    assert_eq!(
        errors.len() + 1,
        ErrorCode::ALL.len(),
        "one error per code but success"
    );
    for e in errors {
        let text = e.to_string();
        let pointer = format!(" (see {ERRORS_DOC}#{})", e.code().doc_entry());
        assert!(
            text.ends_with(&pointer),
            "{text:?} must end with {pointer:?}"
        );
        assert!(text.starts_with("hcomm "), "{text}");
        assert!(text.contains("rank 3 did something"), "{text}");
        assert_eq!(e.detail(), "rank 3 did something");
    }
    assert_eq!(ERRORS_DOC, "docs/errors.md");
}
