// sink-loop-constants: a value a while loop carries unchanged, computed from constants
// alone, is computed again inside the loop (body and condition, where they read it), and
// the loop reads that copy; the carry stays for XLA's while-loop simplifier to drop.
// RUN: remat-opt %s --split-input-file --sink-loop-constants | filecheck %s

// A causal mask (iota, compare, broadcast) carried through a scan: the body builds its own.
// CHECK-LABEL: module @mask
// CHECK: %[[OUTER:.*]] = stablehlo.broadcast_in_dim
// CHECK: stablehlo.while(%[[I:.*]] = %{{.*}}, %[[H:.*]] = %arg0, %[[M:.*]] = %[[OUTER]])
// CHECK: cond
// CHECK-NOT: stablehlo.iota
// CHECK: } do {
// CHECK-NEXT: stablehlo.iota
// CHECK-NEXT: stablehlo.iota
// CHECK-NEXT: %[[C:.*]] = stablehlo.compare GE
// CHECK-NEXT: %[[B:.*]] = stablehlo.broadcast_in_dim %[[C]]
// CHECK: stablehlo.select %[[B]], %[[H]]
// CHECK: stablehlo.return %{{.*}}, %{{.*}}, %[[M]]
module @mask {
func.func @main(%arg0: tensor<2x4x4xf32>) -> tensor<2x4x4xf32> {
  %0 = stablehlo.iota dim = 0 : tensor<4x4xi32>
  %1 = stablehlo.iota dim = 1 : tensor<4x4xi32>
  %2 = stablehlo.compare GE, %0, %1 : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
  %3 = stablehlo.broadcast_in_dim %2, dims = [1, 2] : (tensor<4x4xi1>) -> tensor<2x4x4xi1>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c, %h = %arg0, %m = %3) : tensor<i32>, tensor<2x4x4xf32>, tensor<2x4x4xi1>
  cond {
    %n = stablehlo.constant dense<3> : tensor<i32>
    %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %z = stablehlo.constant dense<0.0> : tensor<2x4x4xf32>
    %s = stablehlo.select %m, %h, %z : tensor<2x4x4xi1>, tensor<2x4x4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s, %m : tensor<i32>, tensor<2x4x4xf32>, tensor<2x4x4xi1>
  }
  return %r#1 : tensor<2x4x4xf32>
}
}

// -----

// A carry computed from an argument stays a carry: the loop cannot rebuild it.
// CHECK-LABEL: module @from_argument
// CHECK: } do {
// CHECK-NOT: stablehlo.broadcast_in_dim
// CHECK: stablehlo.add %[[H:.*]], %[[W:.*]] :
// CHECK: stablehlo.return
module @from_argument {
func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<f32>) -> tensor<4xf32> {
  %w = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c, %h = %arg0, %v = %w) : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  cond {
    %n = stablehlo.constant dense<3> : tensor<i32>
    %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.add %h, %v : tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s, %v : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#1 : tensor<4xf32>
}
}

// -----

// A carry the body changes is no constant of the loop, however it starts.
// CHECK-LABEL: module @changed_carry
// CHECK: } do {
// CHECK-NOT: stablehlo.iota
// CHECK: stablehlo.return
module @changed_carry {
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.iota dim = 0 : tensor<4xf32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %r:2 = stablehlo.while(%i = %c, %h = %0) : tensor<i32>, tensor<4xf32>
  cond {
    %n = stablehlo.constant dense<3> : tensor<i32>
    %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.add %h, %h : tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s : tensor<i32>, tensor<4xf32>
  }
  return %r#1 : tensor<4xf32>
}
}

// -----

// The condition reads the constant carry (a trip count): it gets its own copy too.
// CHECK-LABEL: module @read_by_condition
// CHECK: cond {
// CHECK-NEXT: %[[N:.*]] = stablehlo.constant dense<3>
// CHECK-NEXT: %[[T:.*]] = stablehlo.add %[[N]], %[[N]]
// CHECK-NEXT: stablehlo.compare LT, %{{.*}}, %[[T]]
// CHECK: } do {
// CHECK-NOT: stablehlo.constant dense<3>
// CHECK: stablehlo.return
module @read_by_condition {
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %n = stablehlo.constant dense<3> : tensor<i32>
  %t = stablehlo.add %n, %n : tensor<i32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c, %h = %arg0, %k = %t) : tensor<i32>, tensor<4xf32>, tensor<i32>
  cond {
    %p = stablehlo.compare LT, %i, %k : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.add %h, %h : tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s, %k : tensor<i32>, tensor<4xf32>, tensor<i32>
  }
  return %r#1 : tensor<4xf32>
}
}

// -----

// In split form (@main_fwd and @main_bwd for func=main) both halves' loops are rewritten.
// CHECK-LABEL: func.func @main_fwd
// CHECK: } do {
// CHECK-NEXT: stablehlo.iota
// CHECK-LABEL: func.func @main_bwd
// CHECK: } do {
// CHECK-NEXT: stablehlo.iota
func.func @main_fwd(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.iota dim = 0 : tensor<4xf32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c, %h = %arg0, %v = %0) : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  cond {
    %n = stablehlo.constant dense<3> : tensor<i32>
    %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.multiply %h, %v : tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s, %v : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#1 : tensor<4xf32>
}
func.func @main_bwd(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.iota dim = 0 : tensor<4xf32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c, %h = %arg0, %v = %0) : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  cond {
    %n = stablehlo.constant dense<3> : tensor<i32>
    %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.multiply %h, %v : tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s, %v : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#1 : tensor<4xf32>
}

// -----

// A computation through a custom call (a sharding, a checkpoint name) stays outside.
// CHECK-LABEL: module @through_a_custom_call
// CHECK: } do {
// CHECK-NOT: stablehlo.iota
// CHECK: stablehlo.return
module @through_a_custom_call {
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.iota dim = 0 : tensor<4xf32>
  %1 = stablehlo.custom_call @Sharding(%0) {mhlo.sharding = "{replicated}"} : (tensor<4xf32>) -> tensor<4xf32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c, %h = %arg0, %v = %1) : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  cond {
    %n = stablehlo.constant dense<3> : tensor<i32>
    %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.multiply %h, %v : tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s, %v : tensor<i32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#1 : tensor<4xf32>
}
}
