//! The loss and confusion matrix of a classifier over labelled samples (`Evaluation`): what training runs
//! report and plot, and what `classify --labels` prints.

/// Loss and confusion counts over an evaluation set.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Number of samples evaluated.
    pub samples: u64,
    /// Summed per-sample loss.
    pub loss: f64,
    /// classes × classes, row = true class, column = predicted class.
    pub confusion: Vec<u64>,
    /// Number of classes.
    pub classes: usize,
}

impl Evaluation {
    /// An empty evaluation over `classes` classes.
    pub fn new(classes: usize) -> Evaluation {
        Evaluation { samples: 0, loss: 0.0, confusion: vec![0; classes * classes], classes }
    }

    /// Counts one sample of class `truth` predicted as `predicted` (its loss is added separately).
    pub fn record(&mut self, truth: usize, predicted: usize) {
        self.samples += 1;
        self.confusion[truth * self.classes + predicted] += 1;
    }

    /// Samples predicted right.
    pub fn correct(&self) -> u64 {
        (0..self.classes).map(|k| self.confusion[k * self.classes + k]).sum()
    }

    /// Fraction predicted right, 0 to 1.
    pub fn accuracy(&self) -> f64 {
        self.correct() as f64 / self.samples.max(1) as f64
    }

    /// Mean loss per sample.
    pub fn mean_loss(&self) -> f64 {
        self.loss / self.samples.max(1) as f64
    }

    /// The confusion matrix as rows.
    pub fn confusion_rows(&self) -> Vec<Vec<u64>> {
        self.confusion.chunks(self.classes).map(<[u64]>::to_vec).collect()
    }

    /// The confusion matrix as text: a heading that counts the `images` ("test images"), a header of
    /// predicted classes, one row per true class (its number and, when `names` has more, its name) with
    /// its recall.
    pub fn confusion_table(&self, names: &[&str], images: &str) -> String {
        let c = self.classes;
        let label = |k: usize| if names[k] == k.to_string() { k.to_string() } else { format!("{k} {}", names[k]) };
        let label_width = (0..c).map(|k| label(k).chars().count()).max().unwrap_or(1);
        let mut out = format!(
            "confusion matrix, {} {images} (rows: true class, columns: predicted), accuracy {:.2}%\n{:label_width$}",
            crate::harness::report::count(self.samples as usize),
            100.0 * self.accuracy(),
            ""
        );
        for k in 0..c {
            out += &format!(" {k:>6}");
        }
        out += "  recall";
        for (k, row) in self.confusion_rows().iter().enumerate() {
            out += &format!("\n{:<label_width$}", label(k));
            for n in row {
                out += &format!(" {n:>6}");
            }
            let total: u64 = row.iter().sum();
            out += &format!("  {:>5.1}%", 100.0 * row[k] as f64 / total.max(1) as f64);
        }
        out
    }
}
