//! Data sources more than one pipeline reads, in the shared layer: the MNIST / Fashion-MNIST IDX files
//! (`idx`, found or fetched by `mnist`) and tables (`table` reads them, `dates` their date columns,
//! `infer` their columns' roles, `features` turns them into feature rows and splits), and image files
//! (`images`: PNG, JPEG and PNM made a model's greyscale input). `mnist` and `sales` re-export the
//! modules under their old paths; `fit` reads both kinds.

pub mod dates;
pub mod features;
pub mod idx;
pub mod images;
pub mod infer;
pub mod mnist;
pub mod table;
