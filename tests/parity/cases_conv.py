"""Reference cases for convolution and pooling (tests/test_conv.cpp, tests/test_pool.cpp).

Names: conv_<config>_<dtype>, maxpool_<config>_<dtype>, avgpool_<config>_<dtype>,
adaptive_<config>_<dtype>. Params carry everything the C++ side needs to make the same call.
"""
import torch
import torch.nn.functional as F

from parity_lib import case, channels_last, randn, transposed

DTYPES = ("f32", "f64", "bf16")

# name: (x shape, weight shape, stride, padding, dilation, groups, bias, layout of x)
CONV = {
    "basic": ((2, 3, 7, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, True, "contiguous"),
    "basic_cl": ((2, 3, 7, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, True, "channels_last"),
    "stride2": ((2, 4, 9, 9), (6, 4, 3, 3), (2, 2), (1, 1), (1, 1), 1, True, "contiguous"),
    "stride2_cl": ((2, 4, 9, 10), (6, 4, 3, 3), (2, 2), (1, 1), (1, 1), 1, False, "channels_last"),
    "dilation2": ((2, 4, 10, 9), (5, 4, 3, 3), (1, 1), (2, 2), (2, 2), 1, False, "contiguous"),
    "dilation2_cl": ((2, 4, 10, 9), (5, 4, 3, 3), (1, 1), (1, 2), (2, 2), 1, True, "channels_last"),
    "groups2": ((2, 4, 8, 8), (6, 2, 3, 3), (1, 1), (1, 1), (1, 1), 2, True, "contiguous"),
    "groups2_cl": ((2, 4, 8, 8), (6, 2, 3, 3), (1, 1), (1, 1), (1, 1), 2, True, "channels_last"),
    "depthwise": ((2, 6, 8, 7), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6, True, "contiguous"),
    "depthwise_cl": ((2, 6, 8, 7), (12, 1, 3, 3), (2, 1), (1, 1), (1, 1), 6, False, "channels_last"),
    "rect": ((2, 3, 9, 8), (4, 3, 2, 3), (2, 1), (1, 0), (1, 1), 1, True, "contiguous"),
    "rect_cl": ((2, 3, 9, 8), (4, 3, 3, 1), (1, 2), (0, 1), (1, 2), 1, True, "channels_last"),
    "pointwise_cl": ((2, 8, 5, 6), (16, 8, 1, 1), (1, 1), (0, 0), (1, 1), 1, True, "channels_last"),
    "transposed": ((2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, True, "transposed"),
    "cnn_cl": ((4, 16, 8, 8), (32, 16, 3, 3), (2, 2), (1, 1), (1, 1), 1, True, "channels_last"),
    "cnn": ((4, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1, True, "contiguous"),
    "cnn_s1_cl": ((3, 32, 7, 6), (16, 32, 3, 3), (1, 1), (1, 1), (1, 1), 1, False, "channels_last"),
}

LAYOUT = {"contiguous": lambda a: a, "channels_last": channels_last, "transposed": transposed}

# name: (x shape, kernel, stride, padding, dilation, layout)
MAXPOOL = {
    "k2": ((2, 3, 8, 8), (2, 2), (0, 0), (0, 0), (1, 1), "contiguous"),
    "k3s2p1": ((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), (1, 1), "contiguous"),
    "k3s2p1_cl": ((2, 5, 9, 8), (3, 3), (2, 2), (1, 1), (1, 1), "channels_last"),
    "rect_dil": ((2, 3, 11, 9), (2, 3), (1, 2), (1, 1), (2, 1), "contiguous"),
    "rect_dil_cl": ((2, 4, 11, 9), (3, 2), (2, 1), (1, 0), (1, 2), "channels_last"),
    "ceilless": ((1, 2, 7, 10), (3, 4), (2, 3), (0, 0), (1, 1), "transposed"),
}

# name: (x shape, kernel, stride, padding, count_include_pad, layout)
AVGPOOL = {
    "k2": ((2, 3, 8, 8), (2, 2), (0, 0), (0, 0), True, "contiguous"),
    "k3s2p1": ((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), True, "contiguous"),
    "k3s2p1_excl": ((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), False, "contiguous"),
    "k3s2p1_excl_cl": ((2, 5, 9, 8), (3, 3), (2, 2), (1, 1), False, "channels_last"),
    "rect_cl": ((2, 4, 10, 7), (3, 2), (2, 1), (1, 1), True, "channels_last"),
    "ceilless": ((1, 2, 7, 10), (3, 4), (2, 3), (1, 2), True, "transposed"),
}

# name: (x shape, output size, layout)
ADAPTIVE = {
    "global": ((2, 3, 7, 6), (1, 1), "contiguous"),
    "global_cl": ((2, 5, 7, 6), (1, 1), "channels_last"),
    "uneven": ((2, 3, 9, 7), (4, 3), "contiguous"),
    "uneven_cl": ((2, 4, 9, 7), (4, 3), "channels_last"),
    "upsample": ((1, 2, 5, 4), (7, 6), "transposed"),
}


def cases():
    for dtype in DTYPES:
        for cfg, (xs, ws, stride, padding, dilation, groups, bias, layout) in CONV.items():
            n = f"conv_{cfg}_{dtype}"
            inputs = {"x": LAYOUT[layout](randn(n, *xs)), "w": randn(n + "w", *ws) * 0.5}
            if bias:
                inputs["b"] = randn(n + "b", ws[0])

            def fn(x, w, b=None, stride=stride, padding=padding, dilation=dilation, groups=groups):
                return F.conv2d(x, w, b, stride, padding, dilation, groups)

            # bf16 3x3 stride-1 layers with channels in multiples of 16 run Winograd
            # (src/backend/cpu/conv_winograd.h): its rounded transforms make errors of about 2.6x
            # the direct sum's by norms (test_conv's WinogradBf16AgreesWithF64BesideTheDirectKernels),
            # relative to each result's scale rather than to each element: about 6 for the outputs
            # here, 16 for the weight gradients (sums over 256 positions).
            winograd = dtype == "bf16" and ws[2:] == (3, 3) and stride == (1, 1) and padding == (1, 1) and \
                dilation == (1, 1) and groups == 1 and xs[1] % 16 == 0 and ws[0] % 16 == 0
            # f32 Winograd (oneDNN's F(4x4, 3x3), forced on any 3x3 stride-1 layer by ctest's
            # FT_CONV_ALGO=winograd run) is within 1e-6 by norms, up to 2e-5 on small elements here.
            f32_winograd = dtype == "f32" and ws[2:] == (3, 3) and stride == (1, 1) and dilation == (1, 1) and \
                groups == 1 and xs[1] >= 16 and ws[0] >= 16
            yield case(n, fn, inputs, dtype=dtype, atol=0.3 if winograd else 1e-4 if f32_winograd else None,
                       params={"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
                               "channels_last": layout == "channels_last"})
        for cfg, (xs, kernel, stride, padding, dilation, layout) in MAXPOOL.items():
            n = f"maxpool_{cfg}_{dtype}"

            def fn(x, kernel=kernel, stride=stride, padding=padding, dilation=dilation):
                return F.max_pool2d(x, kernel, stride if stride != (0, 0) else None, padding, dilation)

            yield case(n, fn, {"x": LAYOUT[layout](randn(n, *xs))}, dtype=dtype,
                       params={"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation,
                               "channels_last": layout == "channels_last"})
        for cfg, (xs, kernel, stride, padding, include, layout) in AVGPOOL.items():
            n = f"avgpool_{cfg}_{dtype}"

            def fn(x, kernel=kernel, stride=stride, padding=padding, include=include):
                return F.avg_pool2d(x, kernel, stride if stride != (0, 0) else None, padding,
                                    count_include_pad=include)

            yield case(n, fn, {"x": LAYOUT[layout](randn(n, *xs))}, dtype=dtype,
                       params={"kernel": kernel, "stride": stride, "padding": padding, "count_include_pad": include,
                               "channels_last": layout == "channels_last"})
        for cfg, (xs, out, layout) in ADAPTIVE.items():
            n = f"adaptive_{cfg}_{dtype}"
            yield case(n, lambda x, out=out: F.adaptive_avg_pool2d(x, out), {"x": LAYOUT[layout](randn(n, *xs))},
                       dtype=dtype, params={"output_size": out, "channels_last": layout == "channels_last"})
