//! What the torch.distributed backend (`hcomm.torch`) needs beyond the numpy API: a
//! rendezvous store on a port the system picks, whose address rank 0 then hands the others
//! through torch's own Store, and communicators over a list of ranks made without messages
//! (torch forms a group with its members only).

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use pyo3::prelude::*;

use crate::comm::Communicator;
use crate::errors::{invalid, to_py};

/// hcomm's rendezvous store, hosted by this process on a port the system picks; alive until
/// `close()` or until it is garbage-collected.
#[pyclass(frozen, module = "hcomm._hcomm", name = "RendezvousStore")]
pub struct RendezvousStore {
    inner: Mutex<Option<hcomm::internal::bootstrap::RendezvousStore>>,
    /// `host:port` where the store listens.
    #[pyo3(get)]
    address: String,
}

#[pymethods]
impl RendezvousStore {
    /// Starts a store on `host` (an IP address; all interfaces by default) and a free port;
    /// clients must prove they hold `secret`.
    #[new]
    #[pyo3(signature = (secret, host="0.0.0.0"))]
    fn new(py: Python<'_>, secret: &[u8], host: &str) -> PyResult<RendezvousStore> {
        let ip: IpAddr = host
            .parse()
            .map_err(|_| invalid(format!("RendezvousStore: {host:?} is not an IP address")))?;
        let store = py
            .detach(|| {
                hcomm::internal::bootstrap::RendezvousStore::bind(SocketAddr::new(ip, 0), secret)
            })
            .map_err(to_py)?;
        let address = store.local_addr().to_string();
        Ok(RendezvousStore {
            inner: Mutex::new(Some(store)),
            address,
        })
    }

    /// The port the store listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.address
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// Stops the store and closes its sockets. Idempotent.
    fn close(&self, py: Python<'_>) {
        let taken = self.inner.lock().ok().and_then(|mut g| g.take());
        py.detach(move || drop(taken));
    }
}

/// A communicator of `ranks` of `comm` (in that order), made without messages; every member
/// passes the same `ranks` and `tag` (see `hcomm::Communicator::subset`).
#[pyfunction]
fn _subset(comm: &Communicator, ranks: Vec<usize>, tag: u64) -> PyResult<Communicator> {
    let core = comm.core()?;
    core.subset(&ranks, tag)
        .map(Communicator::wrap)
        .map_err(to_py)
}

/// Adds this file's classes and functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RendezvousStore>()?;
    m.add_function(wrap_pyfunction!(_subset, m)?)?;
    Ok(())
}
