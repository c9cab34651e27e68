use memra_runtime::backend::host::HostBackend;
use memra_runtime::model::{gen::generate, ModelConfig};
use memra_runtime::{program, Battery, RunConfig, Transport};
use std::time::Instant;

#[test]
fn timing_probe() {
    for (name, layers) in [("tiny", 2), ("tiny", 1), ("small", 1)] {
        let t = Instant::now();
        let m = generate(&ModelConfig::preset(name, Some(layers)).unwrap(), 7).unwrap();
        eprintln!("{name} L{layers} gen {:?}", t.elapsed());
        let battery = Battery { prompts: vec![vec![1, 2, 3]], gen_tokens: 2 };
        for tp in [1, 2, 8] {
            let t = Instant::now();
            let cfg = RunConfig::new(tp, Transport::HostBounce, battery.clone()).unwrap();
            let mut b = HostBackend::new(tp).unwrap();
            let r = program::run(&m, &cfg, &mut b).unwrap();
            eprintln!("  tp{tp} 4 steps {:?} tokens {:?}", t.elapsed(), r.tokens);
        }
        let t = Instant::now();
        let cfg = RunConfig::new(1, Transport::HostBounce, Battery::default_for(m.config.vocab, 1)).unwrap();
        let mut b = HostBackend::new(1).unwrap();
        let r = program::run(&m, &cfg, &mut b).unwrap();
        eprintln!("  tp1 default battery {:?} tokens {:?}", t.elapsed(), r.tokens);
    }
    let mut c = ModelConfig::preset("tiny", None).unwrap();
    c.hidden = 512; c.experts = 16; c.expert_width = 1280; c.shared_width = 1280; c.q_heads = 16; c.vocab = 256;
    let t = Instant::now();
    let m = generate(&c, 3).unwrap();
    eprintln!("big small-grid gen {:?}", t.elapsed());
    let battery = Battery { prompts: vec![vec![1, 2, 3, 4], vec![5,6,7,8]], gen_tokens: 3 };
    for tp in [1, 8] {
        let t = Instant::now();
        let cfg = RunConfig::new(tp, Transport::HostBounce, battery.clone()).unwrap();
        let mut b = HostBackend::new(tp).unwrap();
        program::run(&m, &cfg, &mut b).unwrap();
        eprintln!("  tp{tp} {:?}", t.elapsed());
    }
}
