// SCRATCH (removed before hand-off): render plots from receipt directories.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out = std::path::Path::new(&args[1]);
    if args[2] == "--history" {
        let sets: Vec<(String, Vec<memra_receipts::Receipt>)> = args[3..]
            .iter()
            .map(|d| (std::path::Path::new(d).file_name().unwrap().to_string_lossy().to_string(), memra_receipts::store::load_dir(d.as_ref()).unwrap()))
            .collect();
        println!("{:?}", memra_tools::plot::plot_history(&sets, out));
    } else {
        let mut all = Vec::new();
        for d in &args[2..] {
            all.extend(memra_receipts::store::load_dir(d.as_ref()).unwrap());
        }
        println!("{:?}", memra_tools::plot::plot_receipts(&all, out));
    }
}
