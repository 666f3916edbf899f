//! `hcomm._hcomm`: the native module of the Python package `hcomm`. The package's
//! Python files (`python/hcomm/`) re-export it and add the pure-Python parts.

mod buffer;
mod comm;
mod dtype;
mod errors;
mod interrupt;
mod pool;
mod torch_support;

use pyo3::prelude::*;

use comm::Communicator;
use errors::{invalid, to_py};

/// Joins the job this process was launched into (hcommrun, mpirun, mpiexec, srun,
/// torchrun), or the job given by `rank`, `size`, `root_addr` (the rendezvous store's
/// `host:port`, hosted by rank 0) and `secret`; with neither, a world of one rank.
/// `timeout` (seconds) overrides `HCOMM_TIMEOUT`.
#[pyfunction]
#[pyo3(signature = (*, rank=None, size=None, root_addr=None, secret=None, timeout=None))]
fn init(
    py: Python<'_>,
    rank: Option<i64>,
    size: Option<i64>,
    root_addr: Option<String>,
    secret: Option<&Bound<'_, PyAny>>,
    timeout: Option<f64>,
) -> PyResult<Communicator> {
    let mut set: Vec<(&str, String)> = Vec::new();
    match (rank, size) {
        (Some(r), Some(s)) => {
            if r < 0 || s < 1 || r >= s {
                return Err(invalid(format!(
                    "init: rank {r} of size {s}: need 0 <= rank < size"
                )));
            }
            set.push(("HCOMM_RANK", r.to_string()));
            set.push(("HCOMM_SIZE", s.to_string()));
        }
        (None, None) => {}
        _ => {
            return Err(invalid(
                "init: pass rank= and size= together (or neither, to read the launcher's \
                 environment)"
                    .into(),
            ))
        }
    }
    if let Some(a) = root_addr {
        set.push(("HCOMM_ROOT_ADDR", a));
    }
    if let Some(t) = timeout {
        set.push(("HCOMM_TIMEOUT", t.to_string()));
    }
    let secret: Option<Vec<u8>> = match secret {
        None => None,
        Some(s) => Some(if let Ok(text) = s.extract::<String>() {
            text.into_bytes()
        } else {
            s.extract::<Vec<u8>>()
                .map_err(|_| invalid("init: secret must be str or bytes".into()))?
        }),
    };
    let explicit = rank.is_some();
    let mut config = hcomm::Config::from_lookup(|name| {
        if let Some((_, v)) = set.iter().find(|(k, _)| *k == name) {
            return Some(v.clone());
        }
        // Explicit ranks describe another job than a launcher's local rank would.
        if explicit && name == "HCOMM_LOCAL_RANK" {
            return None;
        }
        std::env::var(name).ok()
    })
    .map_err(to_py)?;
    if let Some(s) = secret {
        config.job_secret = Some(hcomm::Secret::new(s));
    }
    let core = py
        .detach(|| hcomm::Communicator::init_with(config))
        .map_err(to_py)?;
    Ok(Communicator::wrap(core))
}

/// Joins, in a new process, the communicator whose members grow it with `token`
/// (`Communicator.grow`): the process gets the next free rank of the grown communicator. Needs
/// no launcher and no job secret (the token authenticates it). `timeout` (seconds) overrides
/// `HCOMM_TIMEOUT`.
#[pyfunction]
#[pyo3(signature = (token, *, timeout=None))]
fn join(py: Python<'_>, token: String, timeout: Option<f64>) -> PyResult<Communicator> {
    let mut config = hcomm::Config::from_env().map_err(to_py)?;
    if let Some(t) = timeout {
        config.timeout = std::time::Duration::try_from_secs_f64(t)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                invalid(format!(
                    "join: timeout {t} is not a positive number of seconds"
                ))
            })?;
    }
    let core = py
        .detach(|| hcomm::Communicator::join_with(config, &token))
        .map_err(to_py)?;
    Ok(Communicator::wrap(core))
}

/// The extension module.
#[pymodule]
fn _hcomm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(join, m)?)?;
    m.add_class::<Communicator>()?;
    m.add_class::<comm::Request>()?;
    m.add_class::<comm::Batch>()?;
    m.add_class::<pool::PoolMemory>()?;
    torch_support::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ERRORS_DOC", hcomm::ERRORS_DOC)?;
    m.add("ANY_SOURCE", comm::ANY_SOURCE)?;
    Ok(())
}
