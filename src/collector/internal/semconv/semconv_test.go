package semconv

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// semconv.go and the docs tables are both generated from src/semconv/registry.yaml
// (tests/test_semconv_registry.py fails when either is stale). These tests check what the
// generator cannot: that the components use the constants rather than literals.

var (
	docPath       = filepath.Join("..", "..", "..", "..", "docs", "semantic-conventions.md")
	collectorRoot = filepath.Join("..", "..")
	// A name skewtrace owns: any such literal must be a registered constant.
	ownName = regexp.MustCompile(`^(training|skewtrace)\.[a-z0-9_.]+$`)
)

// constants returns every constant of this package by value.
func constants(t *testing.T) map[string]string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "semconv.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	byValue := map[string]string{}
	for _, decl := range file.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				value, err := strconv.Unquote(vs.Values[i].(*ast.BasicLit).Value)
				if err != nil {
					t.Fatalf("%s: %v", name.Name, err)
				}
				if other, dup := byValue[value]; !dup || other > name.Name {
					byValue[value] = name.Name
				}
			}
		}
	}
	if len(byValue) < 40 {
		t.Fatalf("only %d constants parsed from semconv.go", len(byValue))
	}
	return byValue
}

func TestEveryConstantIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	for value, name := range constants(t) {
		// The collective span prefix is documented as `collective.<op>`.
		if !strings.Contains(string(doc), "`"+value+"`") &&
			!strings.Contains(string(doc), "`"+value+"<") {
			t.Errorf("%s = %q is not in docs/semantic-conventions.md", name, value)
		}
	}
}

// TestComponentsUseTheConstants reads every non-test Go file of the collector module and
// fails on a string literal that spells a registered name (use the constant) or that looks
// like a skewtrace name but is not registered (add it to src/semconv/registry.yaml).
func TestComponentsUseTheConstants(t *testing.T) {
	byValue := constants(t)
	files := 0
	err := filepath.WalkDir(collectorRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// This package defines the names; fixture builds deliberately odd test input.
			if path == "." || d.Name() == "semconv" || d.Name() == "fixture" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		imports := map[*ast.BasicLit]bool{}
		for _, imp := range file.Imports {
			imports[imp.Path] = true
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING || imports[lit] {
				return true
			}
			value, err := strconv.Unquote(lit.Value)
			if err != nil || !strings.Contains(value, ".") {
				return true
			}
			if name, ok := byValue[value]; ok {
				t.Errorf("%s: literal %q: use semconv.%s", path, value, name)
			} else if ownName.MatchString(value) {
				t.Errorf("%s: %q is not in src/semconv/registry.yaml", path, value)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 10 {
		t.Fatalf("only %d Go files read under %s", files, collectorRoot)
	}
}
