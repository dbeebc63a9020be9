package helper

// HandOverEnv is handOverEnv, for the external tests.
var HandOverEnv = handOverEnv
