//! The Mamba-2 mixer's ops through the timing wrapper: each call keyed by the bytes it moves.

use super::*;

impl<B: Backend> MambaOps<B> for TracedOps<B> {
    memory_bound! {
        fn mamba_split(
            zxbcdt: &B::Tensor,
            z: &mut B::Tensor,
            xbc: &mut B::Tensor,
            dt: &mut B::Tensor,
        ) -> () = tb(zxbcdt) + tb(z) + tb(xbc) + tb(dt);
        fn mamba_merge(
            dz: &B::Tensor,
            dxbc: &B::Tensor,
            ddt: &B::Tensor,
            out: &mut B::Tensor,
        ) -> () = tb(dz) + tb(dxbc) + tb(ddt) + tb(out);
        fn mamba_conv_fwd(
            g: &MambaGeo,
            x: &B::Tensor,
            w: View<'_, B::Tensor>,
            y: &mut B::Tensor,
        ) -> () = tb(x) + vb(&w) + tb(y);
        fn mamba_conv_bwd(
            g: &MambaGeo,
            x: &B::Tensor,
            w: View<'_, B::Tensor>,
            dy: &B::Tensor,
            dx: &mut B::Tensor,
            dw: ViewMut<'_, B::Tensor>,
        ) -> () = tb(x) + vb(&w) + tb(dy) + tb(dx) + 2 * vmb(&dw);
        fn mamba_ssd_fwd(
            g: &MambaGeo,
            xbc: &B::Tensor,
            dt_raw: &B::Tensor,
            ssm: View<'_, B::Tensor>,
            y: &mut B::Tensor,
            dt: &mut B::Tensor,
            da: &mut B::Tensor,
            states: &mut B::Tensor,
        ) -> () = tb(xbc) + tb(dt_raw) + vb(&ssm) + tb(y) + tb(dt) + tb(da) + 2 * tb(states);
        fn mamba_ssd_bwd(
            g: &MambaGeo,
            xbc: &B::Tensor,
            dt: &B::Tensor,
            ssm: View<'_, B::Tensor>,
            dy: &B::Tensor,
            dxbc: &mut B::Tensor,
            ddt_raw: &mut B::Tensor,
            dssm: ViewMut<'_, B::Tensor>,
            states: &mut B::Tensor,
        ) -> () = tb(xbc) + tb(dt) + vb(&ssm) + tb(dy) + tb(dxbc) + tb(ddt_raw) + 2 * vmb(&dssm)
            + 2 * tb(states);
        fn mamba_gate_fwd(
            g: &MambaGeo,
            y: &B::Tensor,
            z: &B::Tensor,
            w: View<'_, B::Tensor>,
            out: &mut B::Tensor,
        ) -> () = tb(y) + tb(z) + vb(&w) + tb(out);
        fn mamba_gate_bwd(
            g: &MambaGeo,
            y: &B::Tensor,
            z: &B::Tensor,
            w: View<'_, B::Tensor>,
            dout: &B::Tensor,
            dy: &mut B::Tensor,
            dz: &mut B::Tensor,
            dw: ViewMut<'_, B::Tensor>,
        ) -> () = tb(y) + tb(z) + vb(&w) + tb(dout) + tb(dy) + tb(dz) + 2 * vmb(&dw);
    }
}
