module archer.dev/e2e/tiny

go 1.22
