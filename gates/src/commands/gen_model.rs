//! `memra-gates gen-model`: write a deterministic model file (docs/DESIGN.md §3.1).

use super::Status;
use crate::args::GenModelArgs;
use crate::error::GateError;
use memra_runtime::model::ModelConfig;

pub fn gen_model(args: &GenModelArgs) -> Result<Status, GateError> {
    crate::paths::check_out(&args.out, crate::paths::OutKind::File("the model file"))?;
    let cfg = ModelConfig::preset(&args.preset, args.layers)?;
    crate::plan::check_fits(&cfg, &format!("gen-model --preset {}", args.preset))?;
    let model = memra_runtime::model::gen::generate(&cfg, args.seed)?;
    memra_runtime::model::format::save(&model, &args.out)?;
    crate::say!("wrote {} ({} preset, seed {}, {} layers)", args.out.display(), args.preset, args.seed, cfg.layers);
    Ok(Status::Passed)
}
