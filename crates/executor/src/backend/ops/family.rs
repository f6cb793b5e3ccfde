//! The macros an op family is written with: `op_list!` keeps a family's op list and makes its
//! trait (`op_family!`: each op's default body refuses it by name); `op_union!` makes the trait
//! that holds every family.

use super::super::types::BackendTypes;
use crate::error::ExecError;

/// The refusal of op `op` by a backend of types `B` that does not run it.
pub fn unsupported<B: BackendTypes>(op: &'static str) -> ExecError {
    ExecError::UnsupportedOp {
        op,
        backend: B::NAME,
    }
}

/// A family's trait from its op list (see the module doc of `backend::ops`): each entry
/// `fn name(args) -> Ret = cost;` becomes `fn name(&self, args) -> Result<Ret, ExecError>`
/// with a body that refuses the op by name; the cost is the timing layer's.
macro_rules! op_family {
    (
        $(#[$family_doc:meta])*
        $family:ident {
            $(
                $(#[$doc:meta])*
                fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $cost:expr;
            )*
        }
    ) => {
        $(#[$family_doc])*
        pub trait $family<B: $crate::backend::types::BackendTypes> {
            $(
                $(#[$doc])*
                fn $name(&self, $($arg: $ty),*) -> Result<$ret, $crate::error::ExecError> {
                    let _ = ($($arg,)*);
                    Err($crate::backend::ops::family::unsupported::<B>(stringify!($name)))
                }
            )*
        }
    };
}
pub(crate) use op_family;

/// A family's op list, written once: `op_list! { $ norm_ops: /// doc NormOps { entries } }`
/// makes the family's trait ([`op_family!`]) and `norm_ops!`, which hands the same list to
/// another macro (`norm_ops!(timed_family)` in `traced_ops` writes the timed forwarding).
/// The leading `$` is passed in for the inner macro's own `$` (macro_rules! cannot write one).
macro_rules! op_list {
    ($d:tt $list:ident: $($family:tt)*) => {
        /// The family's op list, handed to the macro `make` (see `op_list!`).
        macro_rules! $list {
            ($d make:ident) => {
                $d make! { $($family)* }
            };
        }
        pub(crate) use $list;

        $crate::backend::ops::family::op_family! { $($family)* }
    };
}
pub(crate) use op_list;

/// The trait `$name` that every family `$family` makes up, implemented for every type that
/// implements them all.
macro_rules! op_union {
    ($(#[$doc:meta])* $name:ident: $($family:ident),+ $(,)?) => {
        $(#[$doc])*
        pub trait $name<B: $crate::backend::types::BackendTypes>: $($family<B> +)+ {}

        impl<B: $crate::backend::types::BackendTypes, T: $($family<B> +)+> $name<B> for T {}
    };
}
pub(crate) use op_union;

#[cfg(test)]
mod tests {
    use crate::backend::cpu::{Cpu, CpuOps};
    use crate::backend::ops::{ElementwiseOps, NormOps, NormSpec};
    use crate::backend::View;
    use crate::error::ExecError;
    use crate::tracker::Category;
    use parsim_plan::plan::Norm;

    /// A device of the CPU's types that runs no op of these two families.
    struct Bare;
    impl ElementwiseOps<Cpu> for Bare {}
    impl NormOps<Cpu> for Bare {}

    #[test]
    fn an_op_the_backend_lacks_is_refused_by_its_name_and_the_backends() {
        let dev = CpuOps::new();
        let mut y = dev.zeros(Category::Buffers, &[2, 2]);
        let e = Bare.fill(&mut y, 1.0).unwrap_err();
        assert!(
            matches!(
                e,
                ExecError::UnsupportedOp {
                    op: "fill",
                    backend: "cpu"
                }
            ),
            "{e}"
        );
        assert_eq!(e.to_string(), "the cpu backend does not run the op fill");
        let (x, gain) = (
            dev.zeros(Category::Buffers, &[2, 2]),
            dev.zeros(Category::Buffers, &[2]),
        );
        let spec = NormSpec {
            kind: Norm::RmsNorm,
            eps: 1e-5,
        };
        let e = Bare
            .norm_fwd(spec, &x, View::all(&gain), &mut y)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the cpu backend does not run the op norm_fwd"
        );
        // The refusal is the families' default: the CPU's own ops run.
        dev.fill(&mut y, 1.0).expect("the CPU fills");
        assert_eq!(y.data(), &[1.0; 4]);
    }
}
