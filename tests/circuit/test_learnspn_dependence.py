"""RDC and G-test dependence measures, and the column/row splits built on them."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit.rdc import _random_feature_rdc, ecdf, gtest_dependent, gtest_pvalues, gtest_statistics, rdc_matrix
from mpifc.circuit.splitting import split_columns_gtest, split_columns_rdc, split_rows


def _blocks(n: int, rng: np.random.Generator) -> np.ndarray:
    """Two independent blocks of three strongly coupled binary variables: {0,1,2} and {3,4,5}."""
    cols = []
    for _ in range(2):
        z = rng.random(n) < 0.5
        for _ in range(3):
            flip = rng.random(n) < 0.1
            cols.append(np.where(flip, ~z, z))
    return np.column_stack(cols).astype(np.float64)


def test_rdc_detects_nonlinear_dependence_and_independence() -> None:
    rng = np.random.default_rng(0)
    n = 1500
    x = rng.normal(size=n)
    y = x**2 + 0.05 * rng.normal(size=n)  # not monotone: Pearson/Spearman correlation ~ 0
    z = rng.normal(size=n)
    r = rdc_matrix(np.column_stack([x, y, z]), rng=np.random.default_rng(1))
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.2
    assert r[0, 1] > 0.8
    assert r[0, 2] < 0.15 and r[1, 2] < 0.15
    assert np.allclose(r, r.T) and np.all((r >= 0) & (r <= 1))


def test_rdc_one_hot_detects_nonmonotone_categorical_dependence() -> None:
    rng = np.random.default_rng(2)
    n = 1000
    c = rng.integers(0, 3, size=n)
    y = np.array([0.0, 5.0, 1.0])[c] + 0.3 * rng.normal(size=n)
    noise = rng.normal(size=n)
    r = rdc_matrix(np.column_stack([c, y, noise]), categorical=[True, False, False], cards=[3, 0, 0],
                   rng=np.random.default_rng(0))
    assert r[0, 1] > 0.8
    assert r[0, 2] < 0.15


def test_binary_shortcut_equals_general_rdc() -> None:
    """For two-valued columns the closed form |corr| is what the random-feature CCA computes."""
    rng = np.random.default_rng(3)
    data = _blocks(800, rng)
    general = _random_feature_rdc(data, [False] * 6, [2] * 6, 10, 1 / 6, np.random.default_rng(0))
    fast = rdc_matrix(data, rng=np.random.default_rng(0))
    assert np.allclose(general, fast, atol=1e-6)
    assert np.allclose(fast[0, 1], abs(np.corrcoef(data[:, 0], data[:, 1])[0, 1]))


def test_rdc_constant_column_is_independent_of_everything() -> None:
    rng = np.random.default_rng(4)
    data = np.column_stack([rng.normal(size=300), np.full(300, 2.5), rng.normal(size=300)])
    r = rdc_matrix(data, rng=np.random.default_rng(0))
    assert np.all(np.isfinite(r))
    assert r[1, 0] == 0.0 and r[1, 2] == 0.0


def test_rdc_split_separates_independent_groups() -> None:
    rng = np.random.default_rng(5)
    n = 1000
    a = rng.normal(size=n)
    b = rng.normal(size=n)
    data = np.column_stack([a, np.sin(3 * a) + 0.1 * rng.normal(size=n), b, np.exp(b)])
    groups = split_columns_rdc(data, [False] * 4, [0] * 4, 0.3, np.random.default_rng(0))
    assert [g.tolist() for g in groups] == [[0, 1], [2, 3]]


def test_gtest_splits_independent_binary_blocks() -> None:
    data = _blocks(2000, np.random.default_rng(6))
    groups = split_columns_gtest(data, [2] * 6, pvalue=0.001)
    assert [g.tolist() for g in groups] == [[0, 1, 2], [3, 4, 5]]
    p = gtest_pvalues(data, [2] * 6)
    assert p[0, 1] < 1e-10 and p[0, 4] > 1e-3


def test_gtest_matches_contingency_table_statistic() -> None:
    """Cross-check one pair against scipy's G-test (log-likelihood ratio) on the 3x2 table."""
    from scipy.stats import chi2_contingency

    rng = np.random.default_rng(7)
    a = rng.integers(0, 3, size=500)
    b = (rng.random(500) < np.array([0.2, 0.5, 0.6])[a]).astype(int)
    table = np.zeros((3, 2))
    np.add.at(table, (a, b), 1)
    _, p_ref, _, _ = chi2_contingency(table, correction=False, lambda_="log-likelihood")
    p = gtest_pvalues(np.column_stack([a, b]).astype(float), [3, 2])
    assert p[0, 1] == pytest.approx(p_ref, rel=1e-8)


@pytest.mark.parametrize("method", ["kmeans", "gmm"])
def test_row_split_finds_two_separated_clusters(method: str) -> None:
    rng = np.random.default_rng(8)
    data = np.vstack([rng.normal(-5, 1, size=(150, 2)), rng.normal(5, 1, size=(100, 2))])
    labels = split_rows(data, method, 2, seed=0)
    assert set(labels.tolist()) == {0, 1}
    assert labels[0] == 0  # canonical labels: first row is in cluster 0
    assert np.all(labels[:150] == labels[0]) and np.all(labels[150:] != labels[0])


def test_row_split_of_identical_rows_is_one_cluster() -> None:
    labels = split_rows(np.ones((50, 3)), "kmeans", 2, seed=0)
    assert np.all(labels == 0)


def test_dependency_components_match_scipy() -> None:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    from mpifc.circuit.splitting import dependency_components

    rng = np.random.default_rng(9)
    # 40 columns: the transitive closure; 150: label propagation (with a chain, many hops)
    for d in (40, 40, 40, 40, 40, 150, 150, 150):
        adj = rng.random((d, d)) < 0.5 / d
        if d > 64:
            perm = rng.permutation(d)[: d // 2]
            adj[perm[:-1], perm[1:]] = True
        adj = adj | adj.T
        np.fill_diagonal(adj, True)
        groups = dependency_components(adj)
        _, labels = connected_components(csr_matrix(adj), directed=False)
        assert sorted(np.concatenate(groups).tolist()) == list(range(d))
        assert all(np.array_equal(g, np.sort(g)) for g in groups)
        for g in groups:
            assert len(set(labels[g])) == 1 and np.sum(labels == labels[g[0]]) == len(g)
        assert [int(g[0]) for g in groups] == sorted(int(g[0]) for g in groups)


def test_ordinal_ties_make_independent_sparse_binaries_look_dependent() -> None:
    """SPFlow's copula (ties in row order) vs the faithful one (ties share a value): on two
    independent sparse binary columns only the faithful RDC stays near 0."""
    rng = np.random.default_rng(8)
    data = (rng.random((3000, 2)) < 0.05).astype(np.float64)
    faithful = rdc_matrix(data, rng=np.random.default_rng(0))
    ordinal = rdc_matrix(data, rng=np.random.default_rng(0), ties="ordinal", k=20)
    assert faithful[0, 1] == pytest.approx(abs(np.corrcoef(data.T)[0, 1]))
    assert faithful[0, 1] < 0.1
    assert ordinal[0, 1] > 0.5
    # On continuous data (no ties) the two conventions are the same statistic.
    cont = rng.normal(size=(500, 3))
    np.testing.assert_allclose(rdc_matrix(cont, rng=np.random.default_rng(1)),
                               rdc_matrix(cont, rng=np.random.default_rng(1), ties="ordinal"))


def test_rdc_matrix_equals_per_pair_cca() -> None:
    """The batched computation (whitening once per column, one eigenproblem per unordered pair)
    gives, for every pair, the largest canonical correlation of the two columns' random
    features computed directly (orthonormal bases, top singular value of Q_i^T Q_j)."""
    rng = np.random.default_rng(11)
    n, d, k, s = 300, 4, 5, 1 / 6
    a = rng.normal(size=n)
    data = np.column_stack([a, a**2 + 0.3 * rng.normal(size=n), rng.normal(size=n), rng.exponential(size=n)])
    got = rdc_matrix(data, rng=np.random.default_rng(2), k=k, s=s)
    gauss = np.random.default_rng(2).standard_normal((d, 2, k))  # the draw rdc_matrix makes
    u = ecdf(data, "max")
    bases = []
    for j in range(d):
        f = np.sin(np.column_stack([u[:, j], np.ones(n)]) @ (gauss[j] * (s / 2)))
        f -= f.mean(0)
        left, sv, _ = np.linalg.svd(f, full_matrices=False)
        bases.append(left[:, sv > 1e-5 * sv[0]])
    for i in range(d):
        for j in range(d):
            want = 1.0 if i == j else np.linalg.svd(bases[i].T @ bases[j], compute_uv=False)[0]
            assert abs(got[i, j] - want) < 1e-4, (i, j, got[i, j], want)  # ill-conditioned features
    assert np.array_equal(got, got.T)


def test_gtest_dependent_equals_the_pvalue_threshold() -> None:
    """The critical-value comparison decides every pair as the p-values do (binary fast path and
    the one-hot path, columns with a single value included)."""
    rng = np.random.default_rng(4)
    for trial in range(60):
        n, d = int(rng.integers(5, 200)), int(rng.integers(2, 8))
        cards = [2] * d if trial % 2 else list(rng.integers(2, 5, d))
        x = np.column_stack([rng.integers(0, c, n) for c in cards]).astype(float)
        x[:, 1] = np.where(rng.random(n) < 0.6, np.minimum(x[:, 0], cards[1] - 1), x[:, 1])
        if trial % 5 == 0:
            x[:, -1] = 0.0
        p = gtest_pvalues(x, cards)
        for level in (0.05, 1e-3, 1e-6):
            want = p < level
            np.fill_diagonal(want, True)
            assert np.array_equal(gtest_dependent(x, cards, level), want)
    # the binary path's statistics are the one-hot path's
    x = rng.integers(0, 2, (300, 6)).astype(float)
    g2, dof2 = gtest_statistics(np.column_stack([x, np.zeros(300)]), [2] * 6 + [3])
    g, dof = gtest_statistics(x, [2] * 6)
    assert np.allclose(g, g2[:6, :6], atol=1e-9) and np.array_equal(dof, dof2[:6, :6])
