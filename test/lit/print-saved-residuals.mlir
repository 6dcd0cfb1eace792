// --print-saved-residuals: for each part, a '// saved residuals of @f: N
// values, B bytes' line, then one residual per line as JAX's
// print_saved_residuals writes it (arguments first, then values in program
// order); the reports of the parts are joined by '// -----', and the module
// itself is not printed.
// RUN: remat-opt %s --split-input-file --print-saved-residuals | filecheck %s --check-prefix=DEFAULT
// RUN: remat-opt %s --split-input-file --print-saved-residuals --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=NOTHING
// RUN: remat-opt %s --split-input-file --print-saved-residuals --remat-partial-eval='policy=dots_saveable' | filecheck %s --check-prefix=DOTS

// Without a policy everything may be saved: the backward keeps the cosine.
// DEFAULT: // saved residuals of @main: 3 values, 116 bytes
// DEFAULT-NEXT: f32[5,4] from the argument W1
// DEFAULT-NEXT: f32[4] from the argument x
// DEFAULT-NEXT: f32[5] output of cos from model.py:8:11 (predict)
// DEFAULT-NEXT: // -----
// DEFAULT-NEXT: // saved residuals of @main: 2 values, 9 bytes
// DEFAULT-NEXT: bool[3] from the argument mask
// DEFAULT-NEXT: bf16[3] output of cos from model.py:12:8 (g)
// DEFAULT-NEXT: // -----
// DEFAULT-NEXT: // saved residuals of @main: 0 values, 0 bytes
// DEFAULT-NOT: {{.}}

// nothing_saveable: only arguments.
// NOTHING: // saved residuals of @main: 2 values, 96 bytes
// NOTHING-NEXT: f32[5,4] from the argument W1
// NOTHING-NEXT: f32[4] from the argument x
// NOTHING-NEXT: // -----
// NOTHING-NEXT: // saved residuals of @main: 2 values, 9 bytes
// NOTHING-NEXT: bf16[3] from the argument h
// NOTHING-NEXT: bool[3] from the argument mask
// NOTHING-NEXT: // -----
// NOTHING-NEXT: // saved residuals of @main: 0 values, 0 bytes
// NOTHING-NOT: {{.}}

// dots_saveable: the arguments and the dot_general.
// DOTS: // saved residuals of @main: 3 values, 116 bytes
// DOTS-NEXT: f32[5,4] from the argument W1
// DOTS-NEXT: f32[4] from the argument x
// DOTS-NEXT: f32[5] output of dot_general from model.py:7:8 (predict)
// DOTS-NEXT: // -----
// DOTS-NEXT: // saved residuals of @main: 2 values, 9 bytes
// DOTS-NEXT: bf16[3] from the argument h
// DOTS-NEXT: bool[3] from the argument mask
// DOTS-NEXT: // -----
// DOTS-NEXT: // saved residuals of @main: 0 values, 0 bytes
// DOTS-NOT: {{.}}

// sin(W1 @ x): JAX's own example; both arguments are needed by the backward
// dot_generals whatever the policy.
func.func @main(%w1: tensor<5x4xf32> loc("W1"), %x: tensor<4xf32> loc("x"), %ct: tensor<5xf32> {remat.cotangent} loc("ct")) -> (tensor<5xf32>, tensor<5x4xf32>, tensor<4xf32>) {
  %h = stablehlo.dot_general %w1, %x, contracting_dims = [1] x [0] : (tensor<5x4xf32>, tensor<4xf32>) -> tensor<5xf32> loc("jit(predict)/jvp()/dot_general"("predict"("model.py":7:8)))
  %s = stablehlo.sine %h : tensor<5xf32> loc("jit(predict)/jvp()/sin"("predict"("model.py":8:11)))
  %c = stablehlo.cosine %h : tensor<5xf32> loc("jit(predict)/jvp()/cos"("predict"("model.py":8:11)))
  %gh = stablehlo.multiply %ct, %c : tensor<5xf32> loc("jit(predict)/transpose(jvp())/mul"("predict"("model.py":8:11)))
  %gw = stablehlo.dot_general %gh, %x, contracting_dims = [] x [] : (tensor<5xf32>, tensor<4xf32>) -> tensor<5x4xf32> loc("jit(predict)/transpose(jvp())/dot_general"("predict"("model.py":7:8)))
  %gx = stablehlo.dot_general %gh, %w1, contracting_dims = [0] x [0] : (tensor<5xf32>, tensor<5x4xf32>) -> tensor<4xf32> loc("jit(predict)/transpose(jvp())/dot_general"("predict"("model.py":7:8)))
  return %s, %gw, %gx : tensor<5xf32>, tensor<5x4xf32>, tensor<4xf32>
}

// -----

// bf16 and i1 (bool) values: 2 and 1 bytes an element.
func.func @main(%h: tensor<3xbf16> loc("h"), %m: tensor<3xi1> loc("mask"), %ct: tensor<3xbf16> {remat.cotangent}) -> (tensor<3xbf16>, tensor<3xbf16>) {
  %s = stablehlo.sine %h : tensor<3xbf16> loc("jit(g)/jvp()/sin"("g"("model.py":12:8)))
  %y = stablehlo.select %m, %s, %h : tensor<3xi1>, tensor<3xbf16> loc("jit(g)/jvp()/select_n"("g"("model.py":12:4)))
  %c = stablehlo.cosine %h : tensor<3xbf16> loc("jit(g)/jvp()/cos"("g"("model.py":12:8)))
  %gs = stablehlo.multiply %ct, %c : tensor<3xbf16> loc("jit(g)/transpose(jvp())/mul"("g"("model.py":12:8)))
  %g = stablehlo.select %m, %gs, %ct : tensor<3xi1>, tensor<3xbf16> loc("jit(g)/transpose(jvp())/select_n"("g"("model.py":12:4)))
  return %y, %g : tensor<3xbf16>, tensor<3xbf16>
}

// -----

// Constants are never residuals: nothing is saved.
func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %k = stablehlo.constant dense<2.0> : tensor<4xf32>
  %m = stablehlo.multiply %x, %k : tensor<4xf32>
  %g = stablehlo.multiply %ct, %k : tensor<4xf32>
  return %m, %g : tensor<4xf32>, tensor<4xf32>
}
