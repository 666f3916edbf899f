//! The shared-memory names a job left behind.

/// The names in /dev/shm of the job whose `HCOMM_DEBUG=1` output is `text` (found by the
/// prefix of its inbox names); panics when the output names no inbox.
pub fn left_in_dev_shm(text: &str) -> Vec<String> {
    let prefix = text
        .split_whitespace()
        .find(|w| w.starts_with("hcomm-") && w.ends_with("-inbox;"))
        .and_then(|w| w.rsplitn(3, '-').nth(2))
        .unwrap_or_else(|| panic!("no inbox name in the debug output:\n{text}"))
        .to_owned();
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&format!("{prefix}-")))
        .collect()
}
