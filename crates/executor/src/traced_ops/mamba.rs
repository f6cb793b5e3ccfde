//! The Mamba-2 mixer's ops through the timing wrapper: each call keyed by the bytes it moves.

use super::*;

impl<B: Backend> MambaOps<B> for TracedOps<B> {
    fn mamba_split(
        &self,
        zxbcdt: &B::Tensor,
        z: &mut B::Tensor,
        xbc: &mut B::Tensor,
        dt: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let key = self.mem(|| tb(zxbcdt) + tb(z) + tb(xbc) + tb(dt));
        self.run(key, |d| d.mamba_split(zxbcdt, z, xbc, dt))
    }
    fn mamba_merge(
        &self,
        dz: &B::Tensor,
        dxbc: &B::Tensor,
        ddt: &B::Tensor,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let key = self.mem(|| tb(dz) + tb(dxbc) + tb(ddt) + tb(out));
        self.run(key, |d| d.mamba_merge(dz, dxbc, ddt, out))
    }
    fn mamba_conv_fwd(
        &self,
        g: &MambaGeo,
        x: &B::Tensor,
        w: View<'_, B::Tensor>,
        y: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let key = self.mem(|| tb(x) + vb(&w) + tb(y));
        self.run(key, |d| d.mamba_conv_fwd(g, x, w, y))
    }
    fn mamba_conv_bwd(
        &self,
        g: &MambaGeo,
        x: &B::Tensor,
        w: View<'_, B::Tensor>,
        dy: &B::Tensor,
        dx: &mut B::Tensor,
        dw: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let key = self.mem(|| tb(x) + vb(&w) + tb(dy) + tb(dx) + 2 * vmb(&dw));
        self.run(key, |d| d.mamba_conv_bwd(g, x, w, dy, dx, dw))
    }
    fn mamba_ssd_fwd(
        &self,
        g: &MambaGeo,
        xbc: &B::Tensor,
        dt_raw: &B::Tensor,
        ssm: View<'_, B::Tensor>,
        y: &mut B::Tensor,
        dt: &mut B::Tensor,
        da: &mut B::Tensor,
        states: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let key =
            self.mem(|| tb(xbc) + tb(dt_raw) + vb(&ssm) + tb(y) + tb(dt) + tb(da) + 2 * tb(states));
        self.run(key, |d| {
            d.mamba_ssd_fwd(g, xbc, dt_raw, ssm, y, dt, da, states)
        })
    }
    fn mamba_ssd_bwd(
        &self,
        g: &MambaGeo,
        xbc: &B::Tensor,
        dt: &B::Tensor,
        ssm: View<'_, B::Tensor>,
        dy: &B::Tensor,
        dxbc: &mut B::Tensor,
        ddt_raw: &mut B::Tensor,
        dssm: ViewMut<'_, B::Tensor>,
        states: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let key = self.mem(|| {
            tb(xbc)
                + tb(dt)
                + vb(&ssm)
                + tb(dy)
                + tb(dxbc)
                + tb(ddt_raw)
                + 2 * vmb(&dssm)
                + 2 * tb(states)
        });
        self.run(key, |d| {
            d.mamba_ssd_bwd(g, xbc, dt, ssm, dy, dxbc, ddt_raw, dssm, states)
        })
    }
    fn mamba_gate_fwd(
        &self,
        g: &MambaGeo,
        y: &B::Tensor,
        z: &B::Tensor,
        w: View<'_, B::Tensor>,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let key = self.mem(|| tb(y) + tb(z) + vb(&w) + tb(out));
        self.run(key, |d| d.mamba_gate_fwd(g, y, z, w, out))
    }
    fn mamba_gate_bwd(
        &self,
        g: &MambaGeo,
        y: &B::Tensor,
        z: &B::Tensor,
        w: View<'_, B::Tensor>,
        dout: &B::Tensor,
        dy: &mut B::Tensor,
        dz: &mut B::Tensor,
        dw: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let key = self.mem(|| tb(y) + tb(z) + vb(&w) + tb(dout) + tb(dy) + tb(dz) + 2 * vmb(&dw));
        self.run(key, |d| d.mamba_gate_bwd(g, y, z, w, dout, dy, dz, dw))
    }
}
