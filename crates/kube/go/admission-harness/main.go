// admission-harness drives the kube-apiserver's own mutating admission webhook plugin
// (k8s.io/apiserver/pkg/admission/plugin/webhook/mutating, the code a kube-apiserver runs for every
// MutatingWebhookConfiguration) against a webhook listening on this machine, for one pod.
//
// The configuration is the MutatingWebhookConfiguration of deploy/kubernetes as it is (object
// selector, rules, failure policy, timeout, service reference); only the CA bundle is given on the
// command line, and the service it names is resolved to --address, as the API server's service
// resolver resolves a Service to its endpoint. The plugin then matches, calls the webhook over TLS,
// verifies its certificate against the bundle, and applies the JSON patch it answers with.
//
// It prints one JSON object: {"input": the pod as read, "allowed": bool, "error": string, "pod": object, "changedAgain": bool,
// "mutated": bool}. changedAgain tells whether a second admission of the admitted pod changed it
// (the webhook must be idempotent for reinvocationPolicy IfNeeded). Exit status 0 means the
// harness ran; what the plugin decided is in the JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"time"

	registrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/mutating"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/informers"
	fakeclientset "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// resolver sends every Service to the webhook's local address, as the API server's endpoint
// resolver sends it to a pod.
type resolver struct{ address string }

func (r resolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return &url.URL{Scheme: "https", Host: r.address}, nil
}

// authInfo gives the webhook client no credentials of its own: TLS trust comes from the
// configuration's caBundle alone, as for an API server without an admission kubeconfig.
type authInfo struct{}

func (authInfo) ClientConfigFor(string) (*rest.Config, error) { return &rest.Config{}, nil }
func (authInfo) ClientConfigForService(string, string, int) (*rest.Config, error) {
	return &rest.Config{}, nil
}

type result struct {
	Input        *corev1.Pod `json:"input"`
	Allowed      bool        `json:"allowed"`
	Error        string      `json:"error"`
	Pod          *corev1.Pod `json:"pod"`
	Mutated      bool        `json:"mutated"`
	ChangedAgain bool        `json:"changedAgain"`
}

func main() {
	configPath := flag.String("config", "", "MutatingWebhookConfiguration (YAML or JSON)")
	caPath := flag.String("ca-file", "", "PEM CA bundle put into every webhook's clientConfig")
	address := flag.String("address", "", "host:port the webhook's Service resolves to")
	podPath := flag.String("pod", "", "the pod to admit (JSON)")
	flag.Parse()
	if err := run(*configPath, *caPath, *address, *podPath); err != nil {
		fmt.Fprintln(os.Stderr, "admission-harness:", err)
		os.Exit(1)
	}
}

func run(configPath, caPath, address, podPath string) error {
	var config registrationv1.MutatingWebhookConfiguration
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(raw, &config); err != nil {
		return fmt.Errorf("%s: %w", configPath, err)
	}
	ca, err := os.ReadFile(caPath)
	if err != nil {
		return err
	}
	for i := range config.Webhooks {
		config.Webhooks[i].ClientConfig.CABundle = ca
	}
	var pod corev1.Pod
	raw, err = os.ReadFile(podPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &pod); err != nil {
		return fmt.Errorf("%s: %w", podPath, err)
	}

	stop := make(chan struct{})
	defer close(stop)
	// The API server labels every namespace with its name (namespaceSelector matches on it).
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pod.Namespace,
		Labels: map[string]string{"kubernetes.io/metadata.name": pod.Namespace}}}
	client := fakeclientset.NewSimpleClientset(namespace, &config)
	factory := informers.NewSharedInformerFactory(client, 0)
	plugin, err := mutating.NewMutatingWebhook(nil)
	if err != nil {
		return err
	}
	plugin.SetAuthenticationInfoResolverWrapper(func(webhook.AuthenticationInfoResolver) webhook.AuthenticationInfoResolver {
		return authInfo{}
	})
	plugin.SetServiceResolver(resolver{address})
	plugin.SetExternalKubeClientSet(client)
	plugin.SetExternalKubeInformerFactory(factory)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	if err := plugin.ValidateInitialization(); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for !plugin.WaitForReady() {
		if time.Now().After(deadline) {
			return fmt.Errorf("the plugin's configuration source never became ready")
		}
	}

	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	interfaces := admission.NewObjectInterfacesFromScheme(scheme)
	admit := func(p *corev1.Pod) (*corev1.Pod, error) {
		object := p.DeepCopy()
		object.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		attributes := admission.NewAttributesRecord(object, nil, corev1.SchemeGroupVersion.WithKind("Pod"),
			p.Namespace, p.Name, corev1.SchemeGroupVersion.WithResource("pods"), "", admission.Create,
			&metav1.CreateOptions{}, false, &user.DefaultInfo{Name: "admission-harness"})
		err := plugin.Admit(context.Background(), attributes, interfaces)
		return attributes.GetObject().(*corev1.Pod), err
	}

	out := result{Input: &pod}
	admitted, err := admit(&pod)
	if err != nil {
		out.Error = err.Error()
	} else {
		out.Allowed = true
		out.Pod = admitted
		out.Mutated = !reflect.DeepEqual(admitted.Spec, pod.Spec) || !reflect.DeepEqual(admitted.ObjectMeta, pod.ObjectMeta)
		again, err := admit(admitted)
		if err != nil {
			return fmt.Errorf("second admission of the admitted pod failed: %w", err)
		}
		out.ChangedAgain = !reflect.DeepEqual(again.Spec, admitted.Spec) ||
			!reflect.DeepEqual(again.ObjectMeta, admitted.ObjectMeta)
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
