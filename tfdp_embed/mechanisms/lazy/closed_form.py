r"""Closed forms for LazyDP's deferred noise: learning-rate schedules and momentum.

The optimizer (tf-keras `legacy.SGD`, Keras convention: the learning rate
lives inside the momentum) updates one coordinate of one table row as

    m_r = beta * m_{r-1} - eta_r * g_r
    theta_r = theta_{r-1} + m_r                      (standard)
    theta_r = theta_{r-1} + beta * m_r - eta_r g_r   (nesterov=True)

and dense DP-SGD feeds it g_r = (G_r + z_r) / B_r with z_r ~ N(0, sigma^2 C^2),
where G_r is the clipped gradient sum (zero for a row the batch did not
touch). Write the noise of step r as it enters the momentum,

    u_r = -eta_r z_r / B_r ~ N(0, w_r),      w_r = (eta_r sigma C / B_r)^2.

**Idle rows.** Let a row be untouched over steps (h, t], k = t - h. With
G_r = 0 the recursion is linear and, by induction on t,

    m_t     = beta^k m_h                        + sum_r beta^(t-r)       u_r
    theta_t = theta_h + gain_k m_h              + sum_r c_(t-r+gamma)    u_r

with gamma = 0 (standard) or 1 (Nesterov), b = beta^(1+gamma),
c_j = sum_{i<j} beta^i = (1 - beta^j) / (1 - beta) (so c_(j+gamma) =
(1 - b beta^j) / (1 - beta)), and the deterministic drift gain
gain_k = b (1 - beta^k) / (1 - beta). Induction step: one idle step maps
(m, theta) by Phi = [[beta, 0], [b, 1]], and Phi psi_j = psi_(j+1) for the
per-noise coefficient vector psi_j = (beta^j, c_(j+1+gamma)); a fresh
noise enters as psi_0 = (1, 1 + gamma beta).

So the owed noise is, per coordinate, a centred bivariate Gaussian
(M, Theta) with, summing over r in (h, t] and writing
S0 = sum w_r, S1 = sum w_r beta^(t-r), S2 = sum w_r beta^(2(t-r)):

    Var M     = S2
    Cov       = (S1 - b S2) / (1 - beta)
    Var Theta = (S0 - 2 b S1 + b^2 S2) / (1 - beta)^2

(beta = 0: Var Theta = S0 = sum eta_r^2 sigma^2 C^2 / B_r^2, the paper's
aggregated noise N(0, k sigma^2 C^2) / B^2 times eta^2 when eta is constant.)
Coordinates are independent (z_r is isotropic), so one 2x2 Cholesky per
row serves all `dim` coordinates: M = L11 x, Theta = L21 x + L22 y with
x, y ~ N(0, 1), L11 = sqrt(Var M), L21 = Cov / L11,
L22 = sqrt(Var Theta - L21^2). For k = 1 the matrix is singular
(M = u_t, Theta = (1 + gamma beta) u_t) and L22 = 0 up to rounding
(clamped).

**Range queries in O(1).** With per-step running sums (P_0 = A_0 = Q_0 = 0)

    P_t = P_(t-1) + w_t,   A_t = beta A_(t-1) + w_t,   Q_t = beta^2 Q_(t-1) + w_t

we have S0 = P_t - P_h, S1 = A_t - beta^k A_h, S2 = Q_t - beta^(2k) Q_h.
Only decaying powers beta^k <= 1 appear (no beta^(-r), which overflows
float64 after ~7,000 steps at beta = 0.9), and A, Q stay below
max w / (1 - beta). P grows linearly with t, so it is kept as a
Neumaier-compensated pair (hi, lo): P_t - P_h then has relative error
O(eps) rather than O(eps t), which matters for Var Theta at small k where
S0 is multiplied by (1 - beta)^-2. All of it is float64; 32 bytes per step.

The prefix form cancels badly at small k when beta is near 1 (the absolute
error of Var Theta is about eps w / (1 - beta)^4 while Var Theta ~ w k^3),
so for k <= K = 32 the moments are summed directly over the last K steps'
weights (`windowed_moments`; all rows caught up at step t share them).

**State one step ahead of the noise.** The recursion is linear, so a row's
deterministic part (gradients, momentum drift) and its noise can be
advanced separately: if its (m, theta) hold the deterministic state through
step h_d and the noise through h_n <= h_d, the dense DP-SGD state at t is
Phi^(t-h_d) (m, theta) + sum_{r in (h_n, t]} psi_(t-r) u_r, because
Phi psi_j = psi_(j+1). A row touched at step t gets its gradient (and its
momentum) applied by the optimizer at t while its step-t noise is
deferred: h_d = t, h_n = t - 1. LazyDP packs this one-bit difference into
its int32 history.

**Why the released model is exact.** In dense DP-SGD the noise u_r of a row
the batch did not touch changes only that row's (m, theta). Nothing reads
them before the row's next lookup, where LazyDP first adds the owed
(M, Theta) (fresh, independent of everything drawn so far) and the drift:
the joint law of every value ever read, and of the flushed final model,
is that of dense DP-SGD.

Not covered: L2 weight decay (theta <- (1 - eta_r lambda) theta makes Phi
step-dependent; the range query needs matrix prefix products) and
optimizers whose state depends non-linearly on the noisy gradient (Adam,
Adagrad, RMSprop): k skipped steps of those have no Gaussian closed form.

Example:
    >>> sums = advance_running_sums(zero_running_sums(), 0.01, beta=0.9)
    >>> s0, s1, s2 = range_sums(zero_running_sums(), sums, 1, beta=0.9)
    >>> deferred_noise_moments(s0, s1, s2, beta=0.9)  # (0.01, 0.01, 0.01)

References: Lim et al., "LazyDP", ASPLOS 2024, §5.2 and Alg. 1 (lazy noise
update, aggregated noise sampling); the schedule and momentum closed forms
extend its Theorem of §5.2.2 (sum of independent Gaussians).
"""

from __future__ import annotations

import collections

import tensorflow as tf

RunningSums = collections.namedtuple("RunningSums", ["p_hi", "p_lo", "a", "q"])
RunningSums.__doc__ = """Per-step running sums of the noise weights w_r (float64).

Attributes:
  p_hi, p_lo: P_t = sum_{r<=t} w_r as a compensated pair (P = hi + lo).
  a: A_t = sum_{r<=t} beta^(t-r) w_r.
  q: Q_t = sum_{r<=t} beta^(2(t-r)) w_r.
"""

_F64 = tf.float64


def _as64(x) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(x, dtype_hint=_F64), _F64)


def _one_minus_pow(beta: float, exponent) -> tf.Tensor:
    """1 - beta^exponent, accurate for beta near 1 (beta in (0, 1))."""
    return -tf.math.expm1(_as64(exponent) * tf.math.log(_as64(beta)))


def zero_running_sums(shape=()) -> RunningSums:
    """P_0 = A_0 = Q_0 = 0."""
    zero = tf.zeros(shape, _F64)
    return RunningSums(zero, zero, zero, zero)


def advance_running_sums(previous: RunningSums, weight, *, beta: float) -> RunningSums:
    """One step of the running sums: P += w (compensated), A = beta A + w, Q = beta^2 Q + w.

    Args:
      previous: the sums through step t - 1.
      weight: w_t = (eta_t sigma C / B_t)^2, the variance step t's noise adds
        to the momentum (or to the weight when beta = 0).
      beta: the momentum coefficient (0 for plain SGD).

    Returns:
      The sums through step t.
    """
    w = _as64(weight)
    hi = previous.p_hi + w
    # Neumaier: the rounding error of hi = p_hi + w, exactly.
    err = tf.where(tf.abs(previous.p_hi) >= tf.abs(w), (previous.p_hi - hi) + w, (w - hi) + previous.p_hi)
    beta = float(beta)
    return RunningSums(
        p_hi=hi,
        p_lo=previous.p_lo + err,
        a=beta * previous.a + w,
        q=beta * beta * previous.q + w,
    )


def range_sums(start: RunningSums, end: RunningSums, steps, *, beta: float) -> tuple:
    """S0, S1, S2 over the steps (h, t] from the running sums at h and t.

    S0 = sum w_r, S1 = sum beta^(t-r) w_r, S2 = sum beta^(2(t-r)) w_r.

    Args:
      start: running sums at h (any shape, broadcast against `end`).
      end: running sums at t.
      steps: k = t - h >= 0 (int or float tensor).
      beta: momentum coefficient in [0, 1).

    Returns:
      (s0, s1, s2) float64, clamped at 0 against rounding.
    """
    k = _as64(steps)
    s0 = (end.p_hi - start.p_hi) + (end.p_lo - start.p_lo)
    if float(beta) == 0.0:
        decay = tf.cast(tf.equal(k, 0.0), _F64)  # 0^k
        s1 = end.a - decay * start.a
        s2 = end.q - decay * start.q
    else:
        s1 = end.a - tf.pow(_as64(beta), k) * start.a
        s2 = end.q - tf.pow(_as64(beta), 2.0 * k) * start.q
    zero = tf.zeros([], _F64)
    return tf.maximum(s0, zero), tf.maximum(s1, zero), tf.maximum(s2, zero)


def deferred_noise_moments(s0, s1, s2, *, beta: float, nesterov: bool = False) -> tuple:
    """Per-coordinate covariance of the owed (momentum, weight) noise.

    Var M = S2, Cov = (S1 - b S2) / (1 - beta),
    Var Theta = (S0 - 2 b S1 + b^2 S2) / (1 - beta)^2, b = beta^(1 + nesterov).

    Args:
      s0, s1, s2: range sums from `range_sums`.
      beta: momentum coefficient in [0, 1); beta = 0 gives (S0-only) plain SGD.
      nesterov: Keras's Nesterov form (theta += beta m - eta g).

    Returns:
      (var_m, cov, var_theta) float64.
    """
    s0, s1, s2 = _as64(s0), _as64(s1), _as64(s2)
    beta = float(beta)
    b = beta ** (2 if nesterov else 1)
    one_minus = 1.0 - beta
    var_m = s2
    cov = (s1 - b * s2) / one_minus
    var_theta = (s0 - 2.0 * b * s1 + b * b * s2) / (one_minus * one_minus)
    return var_m, cov, tf.maximum(var_theta, tf.zeros([], _F64))


def windowed_moments(recent_weights, *, beta: float, nesterov: bool = False) -> tuple:
    """Moments of the noise of the last k steps, k = 0..K, summed directly (no cancellation).

    Var M = sum_{j<k} w_(t-j) beta^(2j), Cov = sum_{j<k} w_(t-j) beta^j e_j,
    Var Theta = sum_{j<k} w_(t-j) e_j^2, with e_j = (1 - b beta^j) / (1 - beta).

    The prefix-sum form loses accuracy at small k and beta near 1 (Var Theta
    is a difference of terms (1 - beta)^-2 larger than itself); these direct
    sums over a short window of recent steps do not.

    Args:
      recent_weights: float `[K]`, w at lags 0..K-1 (w_t, w_(t-1), ...;
        zero before step 1).
      beta: momentum coefficient in [0, 1).
      nesterov: Keras's Nesterov form.

    Returns:
      (var_m, cov, var_theta), each float64 `[K + 1]`; entry k covers lags < k.
    """
    w = _as64(recent_weights)
    lag = tf.cast(tf.range(tf.shape(w)[0]), _F64)
    coef_m, coef_theta = propagation_coefficients(lag, beta=beta, nesterov=nesterov)
    terms = tf.stack([w * coef_m * coef_m, w * coef_m * coef_theta, w * coef_theta * coef_theta])
    cumulative = tf.concat([tf.zeros([3, 1], _F64), tf.cumsum(terms, axis=1)], axis=1)
    return cumulative[0], cumulative[1], cumulative[2]


def owed_noise_moments(
    start: RunningSums, end: RunningSums, steps, recent_weights, *, beta: float, nesterov: bool = False
) -> tuple:
    """(Var M, Cov, Var Theta) owed for steps (t - k, t]: direct sums for k <= K, range sums beyond.

    With the window, the relative error of Var Theta is at most about
    3 eps / ((1 - beta)^4 K^3) (1e-8 at beta = 0.999, K = 32) instead of
    eps / (1 - beta)^4 at k = 1.

    Args:
      start, end: running sums at t - k (per row) and t.
      steps: int `[n]` k per row.
      recent_weights: float `[K]` as for `windowed_moments` (all rows share t).
      beta, nesterov: as for `deferred_noise_moments`.
    """
    s0, s1, s2 = range_sums(start, end, steps, beta=beta)
    ranged = deferred_noise_moments(s0, s1, s2, beta=beta, nesterov=nesterov)
    window = windowed_moments(recent_weights, beta=beta, nesterov=nesterov)
    size = tf.shape(window[0], out_type=tf.int64)[0] - 1
    k = tf.cast(steps, tf.int64)
    near = k <= size
    index = tf.minimum(k, size)
    return tuple(tf.where(near, tf.gather(w, index), r) for w, r in zip(window, ranged))


def cholesky_2x2(var_m, cov, var_theta) -> tuple:
    """L with L L^T = [[var_m, cov], [cov, var_theta]]; singular matrices allowed.

    Returns:
      (l11, l21, l22): M = l11 x, Theta = l21 x + l22 y for x, y ~ N(0, 1).
    """
    var_m, cov, var_theta = _as64(var_m), _as64(cov), _as64(var_theta)
    l11 = tf.sqrt(tf.maximum(var_m, 0.0))
    l21 = tf.math.divide_no_nan(cov, l11)
    l22 = tf.sqrt(tf.maximum(var_theta - l21 * l21, 0.0))
    return l11, l21, l22


def momentum_drift(steps, *, beta: float, nesterov: bool = False) -> tuple:
    """The deterministic part of `steps` idle steps: m <- decay m, theta <- theta + gain m.

    decay = beta^k, gain = b (1 - beta^k) / (1 - beta), b = beta^(1 + nesterov).

    Args:
      steps: k >= 0 idle steps (tensor).
      beta: momentum coefficient in [0, 1).
      nesterov: Keras's Nesterov form.

    Returns:
      (decay, gain) float64, shaped like `steps`.
    """
    beta = float(beta)
    b = beta ** (2 if nesterov else 1)
    k = _as64(steps)
    if beta == 0.0:
        return tf.cast(tf.equal(k, 0.0), _F64), tf.zeros_like(k)
    return tf.pow(_as64(beta), k), b * _one_minus_pow(beta, k) / (1.0 - beta)


def propagation_coefficients(lag, *, beta: float, nesterov: bool = False) -> tuple:
    """How one step's noise u_r, `lag` = t - r steps ago, enters (m_t, theta_t).

    coef_m = beta^lag, coef_theta = (1 - b beta^lag) / (1 - beta) (= 1 for beta = 0).

    Returns:
      (coef_m, coef_theta) float64, shaped like `lag`.
    """
    beta = float(beta)
    j = _as64(lag)
    if beta == 0.0:
        return tf.cast(tf.equal(j, 0.0), _F64), tf.ones_like(j)
    return tf.pow(_as64(beta), j), _one_minus_pow(beta, j + (2.0 if nesterov else 1.0)) / (1.0 - beta)


__all__ = [
    "RunningSums",
    "advance_running_sums",
    "cholesky_2x2",
    "deferred_noise_moments",
    "momentum_drift",
    "owed_noise_moments",
    "propagation_coefficients",
    "range_sums",
    "windowed_moments",
    "zero_running_sums",
]
