//! Error codes, their messages, the last error of each thread, and the guard every `extern
//! "C"` function runs its body in.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use hcomm_core::{Error, ErrorCode, ERRORS_DOC};

/// Success.
pub const HCOMM_SUCCESS: c_int = 0;
/// Initialization failed, or hcomm is not initialized (called before `hcommInit` or after
/// `hcommFinalize`).
pub const HCOMM_ERR_INIT: c_int = 1;
/// Memory could not be allocated.
pub const HCOMM_ERR_NO_MEM: c_int = 2;
/// A wait ran past `HCOMM_TIMEOUT`.
pub const HCOMM_ERR_TIMEOUT: c_int = 3;
/// An argument was invalid: a NULL pointer where data is needed, a count too large, a rank,
/// root or tag out of range, an unknown type or operation, a destroyed communicator or
/// completed request, a bad environment variable.
pub const HCOMM_ERR_INVALID_ARGUMENT: c_int = 4;
/// A peer rank died or closed its connection.
pub const HCOMM_ERR_PEER_LOST: c_int = 5;
/// Ranks called different collectives, counts, types, operations or roots.
pub const HCOMM_ERR_MISMATCH: c_int = 6;
/// A message was longer than the receive buffer (the message is consumed).
pub const HCOMM_ERR_TRUNCATED: c_int = 7;
/// A transport (socket, shared memory) failed.
pub const HCOMM_ERR_TRANSPORT: c_int = 8;
/// The operation is not supported in this build or configuration.
pub const HCOMM_ERR_NOT_SUPPORTED: c_int = 9;
/// The communicator was aborted.
pub const HCOMM_ERR_ABORTED: c_int = 10;
/// A bug in hcomm: please report it.
pub const HCOMM_ERR_INTERNAL: c_int = 11;
/// The communicator was revoked (`hcommCommRevoke`): shrink it to go on.
pub const HCOMM_ERR_REVOKED: c_int = 12;
/// This side of a partition holds no strict majority of the communicator: it may not shrink.
pub const HCOMM_ERR_QUORUM: c_int = 13;

/// Every code with its C name, in numeric order.
const CODES: [(ErrorCode, &str); 14] = [
    (ErrorCode::Success, "HCOMM_SUCCESS"),
    (ErrorCode::Init, "HCOMM_ERR_INIT"),
    (ErrorCode::NoMem, "HCOMM_ERR_NO_MEM"),
    (ErrorCode::Timeout, "HCOMM_ERR_TIMEOUT"),
    (ErrorCode::InvalidArgument, "HCOMM_ERR_INVALID_ARGUMENT"),
    (ErrorCode::PeerLost, "HCOMM_ERR_PEER_LOST"),
    (ErrorCode::Mismatch, "HCOMM_ERR_MISMATCH"),
    (ErrorCode::Truncated, "HCOMM_ERR_TRUNCATED"),
    (ErrorCode::Transport, "HCOMM_ERR_TRANSPORT"),
    (ErrorCode::NotSupported, "HCOMM_ERR_NOT_SUPPORTED"),
    (ErrorCode::Aborted, "HCOMM_ERR_ABORTED"),
    (ErrorCode::Internal, "HCOMM_ERR_INTERNAL"),
    (ErrorCode::Revoked, "HCOMM_ERR_REVOKED"),
    (ErrorCode::Quorum, "HCOMM_ERR_QUORUM"),
];

static UNKNOWN_CODE: &CStr = c"unknown hcomm error code: not one of the HCOMM_* codes of \
    <hcomm/hcomm.h>; pass the value an hcomm function returned";

thread_local! {
    /// The code and message of the last call that failed on this thread.
    static LAST: RefCell<(c_int, CString)> = RefCell::new((HCOMM_SUCCESS, CString::default()));
}

/// A C string without interior NULs.
fn c_string(s: String) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Records `e` as this thread's last error; returns its code.
pub(crate) fn record(function: &str, e: &Error) -> c_int {
    let code = e.code() as c_int;
    LAST.with(|l| *l.borrow_mut() = (code, c_string(format!("{function}: {e}"))));
    tracing::debug!("{function} failed: {e}");
    code
}

/// Runs the body of the `extern "C"` function `function`: its error becomes its code and this
/// thread's last error, and a panic becomes `HCOMM_ERR_INTERNAL` instead of unwinding into C.
pub(crate) fn guard(function: &str, body: impl FnOnce() -> Result<(), Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => HCOMM_SUCCESS,
        Ok(Err(e)) => record(function, &e),
        Err(panic) => record(function, &internal(panic)),
    }
}

/// Like [`guard`] for functions that return a value: `failed` on error or panic.
pub(crate) fn guard_value<T>(
    function: &str,
    failed: T,
    body: impl FnOnce() -> Result<T, Error>,
) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            record(function, &e);
            failed
        }
        Err(panic) => {
            record(function, &internal(panic));
            failed
        }
    }
}

fn internal(panic: Box<dyn std::any::Any + Send>) -> Error {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    Error::internal(format!("caught at the C boundary: {what}"))
}

/// The message of every code: the code's name, then what it means and what to do.
fn messages() -> &'static [CString] {
    static MESSAGES: OnceLock<Vec<CString>> = OnceLock::new();
    MESSAGES.get_or_init(|| {
        CODES
            .iter()
            .map(|(code, name)| {
                c_string(format!(
                    "{name}: {} (see {ERRORS_DOC}#{})",
                    code.description(),
                    code.doc_entry()
                ))
            })
            .collect()
    })
}

/// What `code` means and what to do about it, ending with its entry of causes and fixes in
/// docs/errors.md: a static string, never NULL, also for a value that is not an hcomm code.
#[no_mangle]
pub extern "C" fn hcommGetErrorString(code: c_int) -> *const c_char {
    let message = catch_unwind(|| {
        usize::try_from(code)
            .ok()
            .and_then(|i| messages().get(i))
            .map_or(UNKNOWN_CODE.as_ptr(), |m| m.as_ptr())
    });
    message.unwrap_or(UNKNOWN_CODE.as_ptr())
}

/// The code of the last hcomm call that failed on this thread (`HCOMM_SUCCESS` if none has).
/// The way to learn why `hcommMalloc` returned NULL or `hcommFree` ignored a pointer.
#[no_mangle]
pub extern "C" fn hcommGetLastError() -> c_int {
    catch_unwind(|| LAST.with(|l| l.borrow().0)).unwrap_or(HCOMM_ERR_INTERNAL)
}

/// The detailed message of the last hcomm call that failed on this thread: the function, what
/// went wrong (the peer, the operation, the argument), what to do and the code's entry in
/// docs/errors.md; `""` if none has. Valid until the next hcomm call on this thread fails.
#[no_mangle]
pub extern "C" fn hcommGetLastErrorMessage() -> *const c_char {
    catch_unwind(|| LAST.with(|l| l.borrow().1.as_ptr())).unwrap_or(c"".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_rust_crate_codes() {
        let c = [
            HCOMM_SUCCESS,
            HCOMM_ERR_INIT,
            HCOMM_ERR_NO_MEM,
            HCOMM_ERR_TIMEOUT,
            HCOMM_ERR_INVALID_ARGUMENT,
            HCOMM_ERR_PEER_LOST,
            HCOMM_ERR_MISMATCH,
            HCOMM_ERR_TRUNCATED,
            HCOMM_ERR_TRANSPORT,
            HCOMM_ERR_NOT_SUPPORTED,
            HCOMM_ERR_ABORTED,
            HCOMM_ERR_INTERNAL,
            HCOMM_ERR_REVOKED,
            HCOMM_ERR_QUORUM,
        ];
        for (i, (code, _)) in CODES.iter().enumerate() {
            assert_eq!(*code as c_int, i as c_int);
            assert_eq!(c[i], i as c_int);
        }
    }

    #[test]
    fn every_code_has_a_message_and_unknown_codes_too() {
        for (i, (code, name)) in CODES.iter().enumerate() {
            // SAFETY: hcommGetErrorString returns a static NUL-terminated string.
            let m = unsafe { CStr::from_ptr(hcommGetErrorString(i as c_int)) };
            let m = m.to_str().unwrap();
            assert!(m.starts_with(name), "{m}");
            assert!(m.len() > name.len() + 10, "{m}");
            let entry = format!(" (see {ERRORS_DOC}#{})", code.doc_entry());
            assert!(m.ends_with(&entry), "{m}");
        }
        for bad in [-1, CODES.len() as c_int, c_int::MAX, c_int::MIN] {
            assert_eq!(hcommGetErrorString(bad), UNKNOWN_CODE.as_ptr());
        }
    }

    #[test]
    fn every_c_code_is_named_in_its_entry_of_the_errors_doc() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/errors.md");
        let doc = std::fs::read_to_string(path).unwrap();
        for (code, name) in CODES {
            let heading = format!("\n## {}\n", code.doc_entry());
            let at = doc
                .find(&heading)
                .unwrap_or_else(|| panic!("no entry {heading:?}"));
            let body = &doc[at + heading.len()..];
            let body = &body[..body.find("\n## ").unwrap_or(body.len())];
            assert!(
                body.contains(&format!("C `{name}`")),
                "{name} in {heading:?}"
            );
        }
    }

    #[test]
    fn guard_turns_errors_and_panics_into_codes() {
        let code = guard("hcommTest", || Err(Error::timeout("slow peer 3")));
        assert_eq!(code, HCOMM_ERR_TIMEOUT);
        assert_eq!(hcommGetLastError(), HCOMM_ERR_TIMEOUT);
        // SAFETY: the last-error string lives until the next failure on this thread.
        let m = unsafe { CStr::from_ptr(hcommGetLastErrorMessage()) };
        assert!(m.to_str().unwrap().contains("slow peer 3"));
        let code = guard("hcommTest", || panic!("boom"));
        assert_eq!(code, HCOMM_ERR_INTERNAL);
        // SAFETY: as above.
        let m = unsafe { CStr::from_ptr(hcommGetLastErrorMessage()) };
        assert!(m.to_str().unwrap().contains("boom"));
        assert_eq!(guard("hcommTest", || Ok(())), HCOMM_SUCCESS);
    }
}
