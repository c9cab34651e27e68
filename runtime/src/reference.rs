//! f64 reference (todo)
