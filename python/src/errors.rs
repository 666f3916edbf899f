//! hcomm errors as Python exceptions: `hcomm.Error` and one subclass per code, defined in
//! `hcomm/errors.py`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `hcomm.errors._from_code(code, message, peer, comm_peer)`, which makes the exception of a
/// code.
static FROM_CODE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The Python exception of a core error, with the peer it concerns (its world and
/// communicator ranks, where known).
pub fn to_py(e: hcomm::Error) -> PyErr {
    Python::attach(|py| {
        let made = FROM_CODE
            .get_or_try_init(py, || {
                py.import("hcomm.errors")?
                    .getattr("_from_code")
                    .map(Bound::unbind)
            })
            .and_then(|f| {
                let peer = e.peer().unwrap_or_default();
                let not_entered: Option<Vec<usize>> = e
                    .not_entered()
                    .map(|n| n.ranks.iter().filter_map(|r| r.comm).collect());
                f.bind(py).call1((
                    e.code() as i32,
                    e.to_string(),
                    peer.world,
                    peer.comm,
                    not_entered,
                ))
            });
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(err) => err,
        }
    })
}

/// `hcomm.InvalidArgument` with `detail`.
pub fn invalid(detail: String) -> PyErr {
    to_py(hcomm::Error::invalid_argument(detail))
}
