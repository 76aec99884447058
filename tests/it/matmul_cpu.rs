//! The matmul CPU reference against products worked by hand: a 2×3 · 3×2 product and the identity.

use textnet::matmul::reference;

#[test]
fn a_small_product_matches_the_hand_computed_one() {
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
    // [1 2 3; 4 5 6] · [7 8; 9 10; 11 12] = [58 64; 139 154]
    assert_eq!(reference(&a, &b, 2, 2, 3).unwrap(), vec![58.0, 64.0, 139.0, 154.0]);
}

#[test]
fn the_identity_leaves_a_matrix_unchanged() {
    let n = 5;
    let identity: Vec<f32> = (0..n * n).map(|i| if i / n == i % n { 1.0 } else { 0.0 }).collect();
    let a: Vec<f32> = (0..n * 3).map(|i| i as f32 * 0.5 - 3.0).collect();
    assert_eq!(reference(&identity, &a, n, 3, n).unwrap(), a);
    let b: Vec<f32> = (0..3 * n).map(|i| 1.0 / (i as f32 + 1.0)).collect();
    assert_eq!(reference(&b, &identity, 3, n, n).unwrap(), b);
}

#[test]
fn mismatched_operands_are_an_error() {
    assert!(reference(&[1.0; 6], &[1.0; 5], 2, 2, 3).is_err());
}
