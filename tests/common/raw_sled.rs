//! Opening a closed store's sled database directly (to damage it), shared by the crate's
//! tests and `rq`'s.

/// Opens the sled database of a closed store directly, waiting up to 2 s for sled's lock:
/// sled's background threads may hold it for a moment after the store closed.
pub fn open_raw_sled(path: &std::path::Path) -> sled::Db {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < give_up =>
            {
                // Polls the lock, as `Store::open` does; the deadline bounds it.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => panic!("open the store's sled database at {path:?}: {e:?}"),
        }
    }
}
