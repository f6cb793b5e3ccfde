//! The Mamba-2 mixer's kernels on host slices (Dao and Gu 2024, "Transformers are SSMs",
//! sec. 6-7; Megatron-Core's MambaMixer), forward and backward: the split of in_proj's output,
//! the causal depthwise convolution with SiLU, the SSD scan with the D skip, and the gated
//! RMSNorm. Rows are tokens, sequence by sequence ([`MambaGeo`]).
//!
//! The scan's forward is the SSD chunked algorithm (sec. 6): inside each chunk of q tokens the
//! quadratic (attention-like) form, between chunks the states passed on. Its backward
//! recomputes the states entering each chunk, then runs the recurrence's adjoint backwards
//! through each chunk from them. [`ssd_sequential`] is the plain recurrence, the tests'
//! reference.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, src, store_all, store_view, Tensor};
use crate::backend::ops::{
    GateGrads, GateInputs, MambaGeo, MambaOps, SsdGrads, SsdInputs, SsdOutputs,
};
use crate::backend::{View, ViewMut};
use crate::error::ExecError;

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

fn silu(v: f32) -> f32 {
    v * sigmoid(v)
}

/// d SiLU(v) / dv.
fn silu_grad(v: f32) -> f32 {
    let s = sigmoid(v);
    s * (1.0 + v * (1.0 - s))
}

fn softplus(v: f32) -> f32 {
    if v > 20.0 {
        v
    } else {
        v.exp().ln_1p()
    }
}

/// Splits each row of `zxbcdt` [n, proj] into z, x/B/C and dt.
pub fn split(g: &MambaGeo, zxbcdt: &[f32], z: &mut [f32], xbc: &mut [f32], dt: &mut [f32]) {
    let (i, c, h) = (g.inner(), g.conv(), g.heads);
    for (t, row) in zxbcdt.chunks_exact(g.proj()).enumerate() {
        z[t * i..(t + 1) * i].copy_from_slice(&row[..i]);
        xbc[t * c..(t + 1) * c].copy_from_slice(&row[i..i + c]);
        dt[t * h..(t + 1) * h].copy_from_slice(&row[i + c..]);
    }
}

/// The reverse of [`split`].
pub fn merge(g: &MambaGeo, dz: &[f32], dxbc: &[f32], ddt: &[f32], out: &mut [f32]) {
    let (i, c, h) = (g.inner(), g.conv(), g.heads);
    for (t, row) in out.chunks_exact_mut(g.proj()).enumerate() {
        row[..i].copy_from_slice(&dz[t * i..(t + 1) * i]);
        row[i..i + c].copy_from_slice(&dxbc[t * c..(t + 1) * c]);
        row[i + c..].copy_from_slice(&ddt[t * h..(t + 1) * h]);
    }
}

/// The convolution's pre-activation at token `t` (within its sequence at `base`), channel `ch`:
/// the bias plus the taps over the last k inputs (zero before the sequence starts).
fn conv_at(g: &MambaGeo, x: &[f32], w: &[f32], base: usize, t: usize, ch: usize) -> f32 {
    let (c, k) = (g.conv(), g.k);
    let wr = &w[ch * (k + 1)..(ch + 1) * (k + 1)];
    let mut u = wr[k];
    for (j, wj) in wr[..k].iter().enumerate() {
        // Tap j reads token t - (k - 1) + j.
        if let Some(src) = (t + j).checked_sub(k - 1) {
            u += wj * x[(base + src) * c + ch];
        }
    }
    u
}

/// y = SiLU(causal depthwise conv(x) + bias), x and y [n, conv], w [conv, k + 1].
pub fn conv_fwd(g: &MambaGeo, x: &[f32], w: &[f32], y: &mut [f32]) {
    let c = g.conv();
    for b in 0..g.b {
        let base = b * g.s;
        for t in 0..g.s {
            for ch in 0..c {
                y[(base + t) * c + ch] = silu(conv_at(g, x, w, base, t, ch));
            }
        }
    }
}

/// dx (written) and dw (accumulated) of [`conv_fwd`] from dy.
pub fn conv_bwd(g: &MambaGeo, x: &[f32], w: &[f32], dy: &[f32], dx: &mut [f32], dw: &mut [f32]) {
    let (c, k) = (g.conv(), g.k);
    dx.fill(0.0);
    for b in 0..g.b {
        let base = b * g.s;
        for t in 0..g.s {
            for ch in 0..c {
                let du = dy[(base + t) * c + ch] * silu_grad(conv_at(g, x, w, base, t, ch));
                dw[ch * (k + 1) + k] += du;
                for j in 0..k {
                    if let Some(src) = (t + j).checked_sub(k - 1) {
                        let xi = (base + src) * c + ch;
                        dx[xi] += w[ch * (k + 1) + j] * du;
                        dw[ch * (k + 1) + j] += du * x[xi];
                    }
                }
            }
        }
    }
}

/// Read access to x, B and C in the rows of x/B/C [n, conv].
struct Xbc<'a> {
    d: &'a [f32],
    g: MambaGeo,
}

impl Xbc<'_> {
    fn x(&self, t: usize, h: usize) -> &[f32] {
        let o = t * self.g.conv() + h * self.g.p;
        &self.d[o..o + self.g.p]
    }

    /// B (`c` false) or C (`c` true) of head `h`'s group at token `t`.
    fn bc(&self, t: usize, h: usize, c: bool) -> &[f32] {
        let g = &self.g;
        let grp = h / (g.heads / g.groups).max(1);
        let o = t * g.conv() + g.inner() + usize::from(c) * g.groups * g.n + grp * g.n;
        &self.d[o..o + g.n]
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// dt = softplus(raw + bias) and dA = dt x A, A = -exp(A_log), for every token and head;
/// `ssm` is [3, heads]: A_log, D, dt's bias.
pub fn discretize(g: &MambaGeo, dt_raw: &[f32], ssm: &[f32], dt: &mut [f32], da: &mut [f32]) {
    let h = g.heads;
    for t in 0..g.tokens() {
        for hd in 0..h {
            let v = softplus(dt_raw[t * h + hd] + ssm[2 * h + hd]);
            dt[t * h + hd] = v;
            da[t * h + hd] = -ssm[hd].exp() * v;
        }
    }
}

/// The SSD chunked scan (Dao and Gu 2024, sec. 6) of every sequence and head, y [n, inner]
/// written with the D skip: y_t = D x_t plus the sum over s <= t of
/// C_t . B_s exp(sum_{s < r <= t} dA_r) dt_s x_s. Inside a chunk the quadratic form; the state
/// entering it (P x N, stored in `states`) carries the chunks before. `d` is D [heads].
pub fn ssd_chunked(
    g: &MambaGeo,
    xbc: &[f32],
    dt: &[f32],
    da: &[f32],
    d: &[f32],
    y: &mut [f32],
    states: &mut [f32],
) {
    let xs = Xbc { d: xbc, g: *g };
    let (h, p, n, q) = (g.heads, g.p, g.n, g.q.max(1));
    let chunks = g.s.div_ceil(q);
    let mut cum = vec![0.0f32; q];
    for b in 0..g.b {
        for hd in 0..h {
            let mut state = vec![0.0f32; p * n];
            for c in 0..chunks {
                let (t0, t1) = (b * g.s + c * q, b * g.s + ((c + 1) * q).min(g.s));
                let slot = ((b * chunks + c) * h + hd) * p * n;
                states[slot..slot + p * n].copy_from_slice(&state);
                let mut acc = 0.0;
                for (i, t) in (t0..t1).enumerate() {
                    acc += da[t * h + hd];
                    cum[i] = acc;
                }
                for (i, t) in (t0..t1).enumerate() {
                    let ci = xs.bc(t, hd, true);
                    let yo = t * g.inner() + hd * p;
                    let out = &mut y[yo..yo + p];
                    // The state entering the chunk, decayed to t: C_t . h exp(cum_i).
                    let decay = cum[i].exp();
                    for (pp, o) in out.iter_mut().enumerate() {
                        *o =
                            d[hd] * xs.x(t, hd)[pp] + decay * dot(ci, &state[pp * n..(pp + 1) * n]);
                    }
                    // Inside the chunk: (C_t . B_s) exp(cum_i - cum_j) dt_s x_s, s <= t.
                    for (j, s) in (t0..=t).enumerate() {
                        let wgt =
                            dot(ci, xs.bc(s, hd, false)) * (cum[i] - cum[j]).exp() * dt[s * h + hd];
                        for (o, xv) in out.iter_mut().zip(xs.x(s, hd)) {
                            *o += wgt * xv;
                        }
                    }
                }
                // The state leaving the chunk.
                let last = cum[t1 - t0 - 1];
                for v in state.iter_mut() {
                    *v *= last.exp();
                }
                for (j, s) in (t0..t1).enumerate() {
                    let wgt = (last - cum[j]).exp() * dt[s * h + hd];
                    let (bs, x) = (xs.bc(s, hd, false), xs.x(s, hd));
                    for pp in 0..p {
                        for nn in 0..n {
                            state[pp * n + nn] += wgt * bs[nn] * x[pp];
                        }
                    }
                }
            }
        }
    }
}

/// The plain recurrence h_t = exp(dA_t) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t,
/// token by token: the reference of [`ssd_chunked`].
pub fn ssd_sequential(g: &MambaGeo, xbc: &[f32], dt: &[f32], da: &[f32], d: &[f32], y: &mut [f32]) {
    let xs = Xbc { d: xbc, g: *g };
    let (h, p, n) = (g.heads, g.p, g.n);
    for b in 0..g.b {
        for hd in 0..h {
            let mut state = vec![0.0f32; p * n];
            for t in b * g.s..(b + 1) * g.s {
                let (a, dtv) = (da[t * h + hd].exp(), dt[t * h + hd]);
                let (bt, ct, x) = (xs.bc(t, hd, false), xs.bc(t, hd, true), xs.x(t, hd));
                for pp in 0..p {
                    let row = &mut state[pp * n..(pp + 1) * n];
                    for (v, bn) in row.iter_mut().zip(bt) {
                        *v = a * *v + dtv * x[pp] * bn;
                    }
                    y[t * g.inner() + hd * p + pp] = dot(row, ct) + d[hd] * x[pp];
                }
            }
        }
    }
}

/// The scan's backward from the saved (x/B/C, dt, ssm) and dy: dxbc and ddt_raw written, dssm
/// [3, heads] accumulated (A_log, D, dt's bias). The states entering each chunk are recomputed
/// into `states`; inside a chunk the token states are rebuilt from them and the recurrence's
/// adjoint runs backwards.
pub fn ssd_bwd(
    g: &MambaGeo,
    (xbc, dt, ssm): (&[f32], &[f32], &[f32]),
    dy: &[f32],
    (dxbc, ddt_raw, dssm): (&mut [f32], &mut [f32], &mut [f32]),
    states: &mut [f32],
) {
    let xs = Xbc { d: xbc, g: *g };
    let (h, p, n, q) = (g.heads, g.p, g.n, g.q.max(1));
    let (conv, inner) = (g.conv(), g.inner());
    let chunks = g.s.div_ceil(q);
    let grp_of = |hd: usize| hd / (h / g.groups).max(1);
    dxbc.fill(0.0);
    let mut hs = vec![0.0f32; q * p * n];
    for b in 0..g.b {
        for hd in 0..h {
            let a = -ssm[hd].exp();
            let dd = ssm[h + hd];
            let da = |t: usize| dt[t * h + hd] * a;
            // The states entering each chunk.
            let mut state = vec![0.0f32; p * n];
            for c in 0..chunks {
                let slot = ((b * chunks + c) * h + hd) * p * n;
                states[slot..slot + p * n].copy_from_slice(&state);
                let (t0, t1) = (b * g.s + c * q, b * g.s + ((c + 1) * q).min(g.s));
                for t in t0..t1 {
                    let (e, dtv) = (da(t).exp(), dt[t * h + hd]);
                    let (bt, x) = (xs.bc(t, hd, false), xs.x(t, hd));
                    for pp in 0..p {
                        for nn in 0..n {
                            let v = &mut state[pp * n + nn];
                            *v = e * *v + dtv * x[pp] * bt[nn];
                        }
                    }
                }
            }
            // The adjoint, chunk by chunk from the last.
            let mut dh = vec![0.0f32; p * n];
            let (mut d_alog, mut d_d, mut d_bias) = (0.0f32, 0.0f32, 0.0f32);
            for c in (0..chunks).rev() {
                let slot = ((b * chunks + c) * h + hd) * p * n;
                let (t0, t1) = (b * g.s + c * q, b * g.s + ((c + 1) * q).min(g.s));
                for (i, t) in (t0..t1).enumerate() {
                    let (e, dtv) = (da(t).exp(), dt[t * h + hd]);
                    let (bt, x) = (xs.bc(t, hd, false), xs.x(t, hd));
                    for pp in 0..p {
                        for nn in 0..n {
                            let prev = if i == 0 {
                                states[slot + pp * n + nn]
                            } else {
                                hs[((i - 1) * p + pp) * n + nn]
                            };
                            hs[(i * p + pp) * n + nn] = e * prev + dtv * x[pp] * bt[nn];
                        }
                    }
                }
                for (i, t) in (t0..t1).enumerate().rev() {
                    let (e, dtv) = (da(t).exp(), dt[t * h + hd]);
                    let (bt, ct, x) = (xs.bc(t, hd, false), xs.bc(t, hd, true), xs.x(t, hd));
                    let dyt = &dy[t * inner + hd * p..t * inner + (hd + 1) * p];
                    let grp = grp_of(hd);
                    let (xo, bo) = (t * conv + hd * p, t * conv + inner + grp * n);
                    let co = bo + g.groups * n;
                    let (mut ddt, mut dda) = (0.0f32, 0.0f32);
                    for pp in 0..p {
                        let hrow = &hs[(i * p + pp) * n..(i * p + pp + 1) * n];
                        let dhr = &mut dh[pp * n..(pp + 1) * n];
                        for nn in 0..n {
                            // y_t = h_t C_t: h_t's gradient and C's.
                            dhr[nn] += ct[nn] * dyt[pp];
                            dxbc[co + nn] += hrow[nn] * dyt[pp];
                        }
                        let mut dxp = dd * dyt[pp];
                        for nn in 0..n {
                            let prev = if i == 0 {
                                states[slot + pp * n + nn]
                            } else {
                                hs[((i - 1) * p + pp) * n + nn]
                            };
                            // h_t = e h_{t-1} + dt x B.
                            dxp += dtv * bt[nn] * dhr[nn];
                            dxbc[bo + nn] += dtv * x[pp] * dhr[nn];
                            ddt += bt[nn] * x[pp] * dhr[nn];
                            dda += e * prev * dhr[nn];
                            dhr[nn] *= e;
                        }
                        dxbc[xo + pp] += dxp;
                        d_d += x[pp] * dyt[pp];
                    }
                    // dA_t = dt_t A, A = -exp(A_log); dt = softplus(raw + bias), whose
                    // derivative sigmoid(raw + bias) is 1 - exp(-dt).
                    ddt += dda * a;
                    d_alog += dda * dtv * a;
                    let dr = ddt * (1.0 - (-dtv).exp());
                    ddt_raw[t * h + hd] = dr;
                    d_bias += dr;
                }
            }
            dssm[hd] += d_alog;
            dssm[h + hd] += d_d;
            dssm[2 * h + hd] += d_bias;
        }
    }
}

/// The gated RMSNorm: out = w x g / rms(g), g = y x SiLU(z), the rms over each of the rank's
/// groups of inner / groups channels.
pub fn gate_fwd(g: &MambaGeo, y: &[f32], z: &[f32], w: &[f32], out: &mut [f32]) {
    let gs = g.inner() / g.groups.max(1);
    let mut gv = vec![0.0f32; gs];
    for (row, (yr, zr)) in y.chunks_exact(gs).zip(z.chunks_exact(gs)).enumerate() {
        for ((v, a), b) in gv.iter_mut().zip(yr).zip(zr) {
            *v = a * silu(*b);
        }
        let r = 1.0 / (dot(&gv, &gv) / gs as f32 + g.eps).sqrt();
        let wo = (row % g.groups.max(1)) * gs;
        for (j, v) in gv.iter().enumerate() {
            out[row * gs + j] = v * r * w[wo + j];
        }
    }
}

/// dy, dz (written) and dw (accumulated) of [`gate_fwd`] of (y, z, w), from dout.
pub fn gate_bwd(
    g: &MambaGeo,
    (y, z, w): (&[f32], &[f32], &[f32]),
    dout: &[f32],
    (dy, dz, dw): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let gs = g.inner() / g.groups.max(1);
    let mut gv = vec![0.0f32; gs];
    let mut gw = vec![0.0f32; gs];
    for (row, (yr, zr)) in y.chunks_exact(gs).zip(z.chunks_exact(gs)).enumerate() {
        for ((v, a), b) in gv.iter_mut().zip(yr).zip(zr) {
            *v = a * silu(*b);
        }
        let r = 1.0 / (dot(&gv, &gv) / gs as f32 + g.eps).sqrt();
        let (wo, o) = ((row % g.groups.max(1)) * gs, row * gs);
        for j in 0..gs {
            gw[j] = w[wo + j] * dout[o + j];
            dw[wo + j] += dout[o + j] * gv[j] * r;
        }
        // d(g r) / dg . a = r a - g r^3 (a . g) / gs.
        let m = dot(&gw, &gv) * r * r * r / gs as f32;
        for j in 0..gs {
            let dg = r * gw[j] - gv[j] * m;
            dy[o + j] = dg * silu(zr[j]);
            dz[o + j] = dg * yr[j] * silu_grad(zr[j]);
        }
    }
}

impl MambaOps<Cpu> for CpuOps {
    fn mamba_split(
        &self,
        zxbcdt: &Tensor,
        z: &mut Tensor,
        xbc: &mut Tensor,
        dt: &mut Tensor,
    ) -> Result<(), ExecError> {
        let g = geo_of(z.cols(), xbc.cols(), dt.cols());
        split(
            &g,
            zxbcdt.data(),
            z.data_mut(),
            xbc.data_mut(),
            dt.data_mut(),
        );
        for t in [z, xbc, dt] {
            store_all(t);
        }
        Ok(())
    }

    fn mamba_merge(
        &self,
        dz: &Tensor,
        dxbc: &Tensor,
        ddt: &Tensor,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let g = geo_of(dz.cols(), dxbc.cols(), ddt.cols());
        merge(&g, dz.data(), dxbc.data(), ddt.data(), out.data_mut());
        store_all(out);
        Ok(())
    }

    fn mamba_conv_fwd(
        &self,
        g: &MambaGeo,
        x: &Tensor,
        w: View<'_, Tensor>,
        y: &mut Tensor,
    ) -> Result<(), ExecError> {
        conv_fwd(g, x.data(), src(&w), y.data_mut());
        store_all(y);
        Ok(())
    }

    fn mamba_conv_bwd(
        &self,
        g: &MambaGeo,
        x: &Tensor,
        w: View<'_, Tensor>,
        dy: &Tensor,
        dx: &mut Tensor,
        mut dw: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        conv_bwd(g, x.data(), src(&w), dy.data(), dx.data_mut(), dst(&mut dw));
        store_all(dx);
        store_view(&mut dw);
        Ok(())
    }

    fn mamba_ssd_fwd(
        &self,
        g: &MambaGeo,
        x: SsdInputs<'_, Tensor>,
        out: SsdOutputs<'_, Tensor>,
        states: &mut Tensor,
    ) -> Result<(), ExecError> {
        let ssm = src(&x.ssm);
        discretize(g, x.dt.data(), ssm, out.dt.data_mut(), out.da.data_mut());
        let d = &ssm[g.heads..2 * g.heads];
        let (dt, da) = (out.dt.data(), out.da.data());
        ssd_chunked(
            g,
            x.xbc.data(),
            dt,
            da,
            d,
            out.y.data_mut(),
            states.data_mut(),
        );
        store_all(out.y);
        Ok(())
    }

    fn mamba_ssd_bwd(
        &self,
        g: &MambaGeo,
        x: SsdInputs<'_, Tensor>,
        dy: &Tensor,
        grads: SsdGrads<'_, Tensor>,
        states: &mut Tensor,
    ) -> Result<(), ExecError> {
        let SsdGrads {
            dxbc,
            ddt_raw,
            mut dssm,
        } = grads;
        let (xv, ssm, dyv) = (x.xbc.data(), src(&x.ssm), dy.data());
        let (dx, ddt) = (dxbc.data_mut(), ddt_raw.data_mut());
        let st = states.data_mut();
        ssd_bwd(
            g,
            (xv, x.dt.data(), ssm),
            dyv,
            (dx, ddt, dst(&mut dssm)),
            st,
        );
        store_all(dxbc);
        store_all(ddt_raw);
        store_view(&mut dssm);
        Ok(())
    }

    fn mamba_gate_fwd(
        &self,
        g: &MambaGeo,
        x: GateInputs<'_, Tensor>,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        gate_fwd(g, x.y.data(), x.z.data(), src(&x.w), out.data_mut());
        store_all(out);
        Ok(())
    }

    fn mamba_gate_bwd(
        &self,
        g: &MambaGeo,
        x: GateInputs<'_, Tensor>,
        dout: &Tensor,
        grads: GateGrads<'_, Tensor>,
    ) -> Result<(), ExecError> {
        let GateGrads { dy, dz, mut dw } = grads;
        let (yv, zv, dov) = (x.y.data(), x.z.data(), dout.data());
        let dwv = dst(&mut dw);
        gate_bwd(
            g,
            (yv, zv, src(&x.w)),
            dov,
            (dy.data_mut(), dz.data_mut(), dwv),
        );
        store_all(dy);
        store_all(dz);
        store_view(&mut dw);
        Ok(())
    }
}

/// The geometry the split and merge need: z's, x/B/C's and dt's widths (one head a dt column;
/// the B/C part is x/B/C's width less z's).
fn geo_of(inner: usize, conv: usize, heads: usize) -> MambaGeo {
    MambaGeo {
        b: 1,
        s: 1,
        heads,
        p: inner / heads.max(1),
        groups: 1,
        n: (conv - inner) / 2,
        k: 1,
        q: 1,
        eps: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_scan_is_dt_x_b_dot_c_plus_d_x() {
        // One head, p = n = 1, one token: h = dt x B, y = h C + D x (by hand).
        let g = MambaGeo {
            b: 1,
            s: 1,
            heads: 1,
            p: 1,
            groups: 1,
            n: 1,
            k: 1,
            q: 1,
            eps: 1e-5,
        };
        let xbc = [2.0, 3.0, 5.0];
        let (dt, da, d) = ([0.5], [-0.1], [0.25]);
        let mut y = [0.0];
        let mut states = vec![0.0; g.states_len()];
        ssd_chunked(&g, &xbc, &dt, &da, &d, &mut y, &mut states);
        assert!((y[0] - (0.5 * 2.0 * 3.0 * 5.0 + 0.25 * 2.0)).abs() < 1e-6);
    }
}
