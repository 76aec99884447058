//! The sales selftest's training problems, on the CPU: the reference run over them stays finite and clear
//! of ReLU's kink nearly always (the selftest draws again, up to 8 times, when one does not), for every
//! optimizer the checks use.

use rand::RngExt;
use rand::SeedableRng;
use textnet::cpu::SeededRng;
use textnet::sales::checks::{TRAINING_CASE, TRAINING_MARGIN, clear_params, optimizers, random_dataset, run};
use textnet::sales::train::CpuSales;

#[test]
fn training_problems_stay_finite_and_clear_of_the_kink() {
    let (shape, rows, batch, epochs) = TRAINING_CASE;
    let mut rng = SeededRng::seed_from_u64(20261123);
    for optim in optimizers() {
        let mut clear = 0;
        let draws = 20;
        for _ in 0..draws {
            let data = random_dataset(rows, 97, shape.inputs, &mut rng);
            let mut cpu = CpuSales::new(&data, clear_params(shape, &mut rng), optim, None).unwrap();
            cpu.kink_margin = Some(f64::INFINITY);
            let (history, params) = run(&mut cpu, rows, batch, epochs, rng.random()).unwrap();
            let finite = history.iter().all(|v| v.is_finite()) && params.all_finite();
            clear += (finite && cpu.kink_margin.unwrap() >= TRAINING_MARGIN) as usize;
        }
        assert!(clear * 10 >= draws * 9, "{}: only {clear} of {draws} problems were usable", optim.describe());
    }
}
