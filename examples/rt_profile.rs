use reliable_queue::Store;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(100_000, |a| a.parse().unwrap());
    let kind = std::env::args().nth(2).unwrap_or_else(|| "vec".into());
    let store = Store::in_memory().unwrap();
    let item = vec![7u8; 100];
    if kind == "vec" {
        let q = store.blocking_queue::<Vec<u8>>("q").unwrap();
        for _ in 0..n {
            let mut tx = store.begin();
            q.enqueue(&mut tx, item.clone()).unwrap();
            tx.blocking_commit().unwrap();
            let mut tx = store.begin();
            let got = q.blocking_try_dequeue(&mut tx).unwrap();
            std::hint::black_box(got);
            tx.blocking_commit().unwrap();
        }
    }
}
