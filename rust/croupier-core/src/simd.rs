//! The vector instruction sets the kernels come in, and which of them this CPU runs. Every
//! level computes the same integer or `f64` operations, so the same results; the wider ones
//! compute more lanes at once.

/// A kernel level: portable scalar code, AVX2 or AVX-512.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Simd {
    /// Scalar code for any CPU (the blend also runs it for more members than a vector kernel
    /// holds).
    Portable,
    /// AVX2: 256-bit vectors.
    Avx2,
    /// AVX-512 (its foundation, `avx512f`): 512-bit vectors and 32 registers.
    Avx512,
}

impl Simd {
    /// The widest level this CPU runs (AVX-512 with AVX2 beside it: its kernels fall back
    /// on AVX2's, and every level runs the ones below it).
    pub(crate) fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx2")
            {
                return Simd::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Portable
    }

    /// Every level this CPU runs, narrowest first, for the tests.
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Self> {
        [Simd::Portable, Simd::Avx2, Simd::Avx512]
            .into_iter()
            .filter(|&s| s <= Simd::best())
            .collect()
    }
}
